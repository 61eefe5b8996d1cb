"""The oracle at long context: packed-key scoring, attention reading only the named records, and
decoded caches built only when read — all bit-identical between engines and thread counts."""

from __future__ import annotations

import numpy as np
import pytest

from csa_conform.golden.recipes import suite_recipes
from csa_conform.golden.recipes.stream import assemble
from csa_conform.numerics.records import decode_fp8_record
from csa_conform.oracle import run_step
from csa_conform.oracle.compiled import parallel
from csa_conform.oracle.compression_update import present_compression
from csa_conform.oracle.engine import numba_available
from csa_conform.oracle.sparse_sink_softmax_attention import candidate_rows

PREFILL = "long.r4-n2-i8-prefill-t65537"


@pytest.fixture(scope="module")
def long_step():
    (recipe,) = suite_recipes("full", 0, PREFILL)
    plan = recipe.build(recipe.seed)
    return plan.attrs, assemble(plan, plan.steps[0], plan.initial_state), list(plan.output_names)


def _payload_bytes(result) -> dict:
    return {(stage, name): (array.shape, np.asarray(array).tobytes())
            for stage, payload in result.stages.items() for name, array in payload.items()}


@pytest.mark.skipif(not numba_available(), reason="numba is not installed (pip install -e '.[fast]')")
def test_engines_and_thread_counts_agree_on_a_step_over_sixteen_thousand_records(long_step, monkeypatch):
    reference = _payload_bytes(run_step(*long_step, engine="numpy"))
    assert reference["index_scoring", "scores"][0] == (1, 3, 16384)
    for workers in (1, 3):
        monkeypatch.setattr(parallel, "worker_count", lambda workers=workers: workers)
        monkeypatch.setattr("csa_conform.oracle.compiled.stage_kernels.worker_count", lambda workers=workers: workers)
        assert _payload_bytes(run_step(*long_step, engine="numba")) == reference


def test_decoded_records_are_built_on_first_read_only_and_keep_the_payload_order():
    decodes = []

    def counting_decode(records):
        decodes.append(records.shape)
        return decode_fp8_record(records)

    class Geometry:
        cache_format = "fp8_e4m3_block64"

    past = np.zeros((1, 3, 583), dtype=np.uint8)
    packed = np.full((1, 1, 583), 0x38, dtype=np.uint8)
    payload = present_compression(Geometry(), past, None, packed, np.zeros(1), counting_decode)
    assert list(payload) == ["present_compressed_kv", "present_compression_carry", "logical_records"]
    assert decodes == [] and payload["present_compressed_kv"].shape == (1, 4, 583)
    assert list(payload.built()) == ["present_compressed_kv", "present_compression_carry"] and decodes == []
    first = payload["logical_records"]
    assert payload["logical_records"] is first and decodes == [(1, 4, 583)]
    assert payload.built()["logical_records"] is first
    assert first.tobytes() == decode_fp8_record(payload["present_compressed_kv"]).tobytes()


def test_attention_gathers_only_the_records_its_candidates_name(long_step):
    attrs, inputs, outputs = long_step
    result = run_step(attrs, inputs, outputs)
    from csa_conform.contract import validate_step

    geometry = validate_step(attrs, inputs, outputs)
    candidates = result.stages["candidate_assembly"]["candidates"]
    cache = result.stages["compression_update"]["present_compressed_kv"]
    poisoned = cache.copy()
    named = np.unique(candidates[..., geometry.dense_candidates :])
    named = named[named >= 0]
    unnamed = np.setdiff1d(np.arange(cache.shape[1]), named)
    poisoned[:, unnamed] = 0x7F  # NaN codes: decoding any of them would show
    source, rows = candidate_rows(geometry, inputs["current_kv"], poisoned, candidates)
    assert source.shape[1] == inputs["current_kv"].shape[1] + named.size + 1
    assert np.isfinite(source).all()
    compressed = candidates[..., geometry.dense_candidates :]
    picked = source[0][rows[0][..., geometry.dense_candidates :]]
    assert picked.tobytes() == decode_fp8_record(cache[0][compressed[0]]).tobytes()
