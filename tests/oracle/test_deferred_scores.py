"""Attention's scores beyond HELD_SCORES_BYTES are not held by the step: each query chunk's scores are
used and dropped, and the payload recomputes them on first read. Forced on every multi-query step of
goldens/ci.h5 (the threshold at zero, the numba engine's chunks a few queries each), both engines give
the held run's outputs, payloads and rejections bit for bit, and leave the scores unbuilt until read."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_pairs import needs_numba, outcome

from csa_conform.golden import GoldenFile
from csa_conform.oracle import run_step
from csa_conform.oracle import sparse_sink_softmax_attention as attention
from csa_conform.oracle.compiled import stage_kernels as compiled_stages
from csa_conform.oracle.payloads import StagePayload

CI_GOLDENS = Path(__file__).resolve().parents[2] / "goldens" / "ci.h5"
ATTENTION = "sparse_sink_softmax_attention"


def prefill_steps():
    """Every ci step of more than one query (bias, FP8, rejected steps among them)."""
    with GoldenFile(CI_GOLDENS) as golden:
        for case_id in golden.case_ids():
            info = golden.case_info(case_id)
            for index in range(info.step_count):
                step = golden.read_step(case_id, index)
                query = step.inputs.get("query")
                if query is not None and query.shape[1] > 1:
                    yield case_id, index, info.attrs, step.inputs, list(info.output_names)


def _unheld(monkeypatch) -> None:
    monkeypatch.setattr(attention, "HELD_SCORES_BYTES", 0)
    monkeypatch.setattr(compiled_stages, "SOFTMAX_CHUNK_ELEMENTS", 1)  # the numba engine: one query a chunk


@pytest.mark.parametrize("engine", ["numpy", pytest.param("numba", marks=needs_numba)])
def test_unheld_scores_are_the_held_ones_bit_for_bit(engine, monkeypatch):
    steps = list(prefill_steps())
    held = [outcome(attrs, inputs, names, engine) for _, _, attrs, inputs, names in steps]
    _unheld(monkeypatch)
    deferred, softmax_rejections = 0, 0
    for (case_id, index, attrs, inputs, names), expected in zip(steps, held):
        assert outcome(attrs, inputs, names, engine) == expected, (case_id, index)
        if expected[0] == "ran":
            payload = run_step(attrs, inputs, names, engine=engine).stages[ATTENTION]
            assert isinstance(payload, StagePayload) and list(payload) == ["scores", "Y"]
            assert "scores" not in payload.built(), (case_id, index)
            deferred += 1
        else:
            softmax_rejections += "softmax denominator is invalid" in expected[1]
    assert deferred > 20 and softmax_rejections >= 1, (deferred, softmax_rejections)


def test_small_scores_are_held(monkeypatch):
    case_id, index, attrs, inputs, names = next(prefill_steps())
    payload = run_step(attrs, inputs, names, engine="numpy").stages[ATTENTION]
    assert not isinstance(payload, StagePayload) and list(payload) == ["scores", "Y"]
