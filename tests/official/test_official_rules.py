"""Each rule of the official profile (specs/official-profile.md) pinned on inputs that rule changes.

The profile must equal the scalar model of tests/official/official_model.py
bit for bit; for every rule, the model with that one rule broken must differ
on the same rows, so a profile that broke the rule would fail here.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from official_model import RULES, SCORING_RULES, attention_row, index_score, online_row

from csa_conform._base.resources import ci_goldens
from csa_conform.golden import GoldenFile
from csa_conform.numerics.bf16 import bf16_round
from csa_conform.numerics.libm import expf
from csa_conform.oracle import run_step
from csa_conform.oracle.sparse_sink_softmax_attention import candidate_rows
from csa_conform.profiles.official import attention, run_official_step
from csa_conform.profiles.official.attention import BLOCK, online_softmax
from csa_conform.profiles.official.exp import fast_expf
from csa_conform.profiles.official.index_scoring import official_index_scoring
from csa_conform.profiles.official.selection import official_selection

ATTENTION_CASE = "boundaries.r128-resumed-247-to-257"  # 130 candidates: three blocks of 64
TIE_CASE = "errors.topk-tie-zero-weights"


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def golden_step(case_id: str, index: int = 0):
    golden = GoldenFile(ci_goldens())
    info = golden.case_info(case_id)
    return info, golden.read_step(case_id, index)


@pytest.fixture(scope="module")
def attention_step():
    info, step = golden_step(ATTENTION_CASE)
    inputs = dict(step.inputs)
    # One head's sink far above its scores, one below: the sink's place relative to the max shows.
    inputs["head_sink"] = np.array([6.0], dtype=np.float32) + inputs["head_sink"]
    # Inputs off the bf16 grid, so the casts of q and kv to bf16 show.
    for name in ("query", "current_kv"):
        inputs[name] = inputs[name] * np.float32(1.0001)
    result = run_official_step(info.attrs, inputs, list(info.output_names), engine="numpy")
    return info, inputs, result


def model_rows(info, inputs, result, broken=None):
    """Y of every (b, s, h) row by the scalar model, in the profile's layout."""
    stages = result.stages
    candidates = stages["candidate_assembly"]["candidates"]
    geometry = SimpleNamespace(
        dense_candidates=_dense(info, inputs, candidates), current_kv_base=_kv_base(inputs),
        current_kv_len=inputs["current_kv"].shape[1],
    )
    source, rows = candidate_rows(
        geometry, inputs["current_kv"], stages["compression_update"]["logical_records"], candidates,
    )
    query = inputs["query"]
    scale = np.float32(1) / np.sqrt(np.float32(query.shape[-1]))
    expected = np.zeros(query.shape, dtype=np.float32)
    for b, s, h in np.ndindex(query.shape[:3]):
        kv = source[b, rows[b, s]]
        valid = candidates[b, s] >= 0
        expected[b, s, h] = attention_row(query[b, s, h], kv, valid, inputs["head_sink"][h], scale, broken=broken)
    return expected


def _kv_base(inputs):
    total = int(inputs["total_sequence_length"])
    return total - inputs["current_kv"].shape[1]


def _dense(info, inputs, candidates):
    return candidates.shape[-1] - int(inputs["total_sequence_length"]) // int(info.attrs["compression_ratio"])


def test_attention_spans_several_blocks(attention_step):
    _, _, result = attention_step
    assert result.stages["candidate_assembly"]["candidates"].shape[-1] > 2 * BLOCK


def test_attention_equals_the_rules(attention_step):
    info, inputs, result = attention_step
    y = result.stages["sparse_sink_softmax_attention"]["Y"]
    assert same_bits(y, model_rows(info, inputs, result))


@pytest.mark.parametrize("rule", RULES)
def test_breaking_an_attention_rule_changes_y(attention_step, rule):
    info, inputs, result = attention_step
    y = result.stages["sparse_sink_softmax_attention"]["Y"]
    assert not same_bits(y, model_rows(info, inputs, result, broken=rule))


def test_y_is_bf16_and_differs_from_the_reference(attention_step):
    info, inputs, result = attention_step
    y = result.outputs["Y"]
    assert not (y.view(np.uint32) & np.uint32(0xFFFF)).any()
    reference = run_step(info.attrs, inputs, list(info.output_names), engine="numpy").outputs["Y"]
    assert reference.tobytes() != y.tobytes()
    assert np.abs(reference - y).max() < 0.05 * np.abs(reference).max()


def test_shared_stages_are_the_reference(attention_step):
    info, inputs, result = attention_step
    reference = run_step(info.attrs, inputs, list(info.output_names), engine="numpy")
    for stage in ("compression_update", "candidate_assembly"):
        for tensor, value in reference.stages[stage].items():
            assert result.stages[stage][tensor].tobytes() == value.tobytes(), (stage, tensor)


@pytest.fixture(scope="module")
def scoring_inputs():
    """Synthetic transformed queries and keys (bf16 values), f32 weights, I=3 (its scalar is not a power of 2)."""
    rng = np.random.default_rng(19)
    batch, sequence, heads, width, records = 1, 3, 3, 128, 12
    transformed = bf16_round(rng.normal(0, 1, (batch, sequence, heads, width)).astype(np.float32))
    keys = bf16_round(rng.normal(0, 1, (batch, records, width)).astype(np.float32))
    weights = rng.normal(0, 1, (batch, sequence, heads)).astype(np.float32)
    geometry = SimpleNamespace(start=4 * records, sequence=sequence, next_records=records, batch=batch)
    payload, failure = official_index_scoring(geometry, transformed, keys, weights, None)
    assert failure is None
    scores = payload["scores"]
    return transformed, keys, weights, scores


def model_scores(transformed, keys, weights, broken=None):
    batch, sequence, _, _ = transformed.shape
    expected = np.empty((batch, sequence, keys.shape[1]), dtype=np.float32)
    for b, s, c in np.ndindex(expected.shape):
        expected[b, s, c] = index_score(transformed[b, s], keys[b, c], weights[b, s], broken)
    return expected


def test_scoring_equals_the_rules(scoring_inputs):
    *inputs, scores = scoring_inputs
    assert same_bits(scores, model_scores(*inputs))


@pytest.mark.parametrize("rule", SCORING_RULES)
def test_breaking_a_scoring_rule_changes_scores(scoring_inputs, rule):
    *inputs, scores = scoring_inputs
    assert not same_bits(scores, model_scores(*inputs, broken=rule))


def test_scores_are_bf16(scoring_inputs):
    scores = scoring_inputs[-1]
    assert not (scores.view(np.uint32) & np.uint32(0xFFFF)).any()


def test_scoring_keeps_the_causal_mask():
    info, step = golden_step("seed-closed-form.r4-prefill-16")
    official = run_official_step(info.attrs, step.inputs, list(info.output_names), engine="numpy")
    reference = step.stages["index_scoring"]["scores"]
    assert np.array_equal(official.stages["index_scoring"]["scores"] == -np.inf, reference == -np.inf)


def test_the_block_sums_ascend_in_candidate():
    """Values 1, 2^27, -2^27 under equal logits: ascending gives 0 + ..., descending keeps the 1."""
    values = np.zeros((1, 1, 3, 2), dtype=np.float32)
    values[0, 0, :, 0] = [1.0, 2.0**27, -(2.0**27)]
    values[0, 0, :, 1] = [1.0, 1.0, 1.0]
    logits = np.zeros((1, 1, 1, 3), dtype=np.float32)
    sink = np.array([-4.0], dtype=np.float32)
    y, failure = online_softmax(logits, values, sink, expf, 0)
    assert failure is None
    assert same_bits(y[0, 0, 0], online_row(logits[0, 0, 0], values[0, 0], sink[0]))
    assert not same_bits(y[0, 0, 0], online_row(logits[0, 0, 0], values[0, 0], sink[0], broken="block_order"))
    assert y[0, 0, 0, 0] == 0.0


def test_fast_exp_is_a_switch(attention_step, monkeypatch):
    x = np.linspace(-30, 0, 20001, dtype=np.float32)
    assert (fast_expf(x) != expf(x)).any()
    assert np.abs(fast_expf(x) / expf(x) - 1).max() < 1e-5  # the argument x*log2(e) rounded to binary32 costs up to |x| * 2^-24
    info, inputs, _ = attention_step
    chosen = []
    monkeypatch.setattr(attention, "official_exp", lambda choice: chosen.append(choice) or expf)
    run_official_step(info.attrs, inputs, list(info.output_names), engine="numpy", exp="fast")
    assert chosen == ["fast"]


def test_ties_keep_ascending_record_order():
    geometry = SimpleNamespace(topk_width=4, batch=1, index_heads=2)
    scores = np.array([[[1.0, 2.0, 2.0, -0.0, 0.0, 2.0, -np.inf]]], dtype=np.float32)
    live = scores != -np.inf
    selected = official_selection(geometry, scores, live)
    assert selected["selected"].tolist() == [[[1, 2, 5, 0]]]
    short = official_selection(SimpleNamespace(topk_width=7, batch=1, index_heads=1), scores, live)
    assert short["selected"].tolist() == [[[1, 2, 5, 0, 3, 4, -1]]]  # -0 and +0 tie; -inf is padding
    assert selected["selected_indices"].shape == (1, 2, 1, 4)


def test_a_tie_the_reference_rejects_is_ordered():
    info, step = golden_step(TIE_CASE)
    assert "tie" in step.expect_error
    result = run_official_step(info.attrs, step.inputs, list(info.output_names), engine="numpy")
    selected = result.stages["selection"]["selected"]
    width = selected.shape[-1]
    assert selected[0, 0].tolist() == list(range(width))


