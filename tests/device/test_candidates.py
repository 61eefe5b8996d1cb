"""Stage 6 read back from the fused attention launch's scores: a slot's id is corrected only by scores that
identify a key, never by the scores every key of zeros gets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from csa_conform.contract import validate_step
from csa_conform.device.candidates import candidates_read_back, hidden_by_bias
from csa_conform.golden import GoldenFile

CI_GOLDENS = Path(__file__).resolve().parents[2] / "goldens" / "ci.h5"

CASE = "edges.r128-f32-b2-block-end-in-step"  # step 0: rows b, s = 1 score records 0 and 1 at slots 128, 129


def _step():
    with GoldenFile(CI_GOLDENS) as golden:
        info, step = golden.case_info(CASE), golden.read_step(CASE, 0)
    return validate_step(info.attrs, step.inputs, info.output_names), step.stages


def _read_back(g, scores, reference):
    return candidates_read_back(g, scores, None, None, reference)


def test_a_slot_scored_as_its_neighbour_is_that_neighbours_record():
    g, reference = _step()
    expected = reference["candidate_assembly"]["candidates"]
    assert expected[0, 1, 128] == 0 and expected[0, 1, 129] == 1
    scores = reference["sparse_sink_softmax_attention"]["scores"].copy()
    scores[0, 1, :, 129] = scores[0, 1, :, 128]  # the kernel scored record 0 again where record 1 belongs
    ids = _read_back(g, scores, reference)
    assert ids[0, 1, 129] == 0
    ids[0, 1, 129] = 1
    assert np.array_equal(ids, expected)


def test_scores_of_a_key_of_zeros_name_no_record():
    """Record 0 is all zeros in this reference (its scores 0); the kernel decodes record 1 to zeros as well:
    that the two slots score alike says nothing of which record the kernel read, so slot 129 keeps id 1 and
    the divergence is left to attention's scores."""
    g, reference = _step()
    reference = {stage: dict(payload) for stage, payload in reference.items()}
    expected_scores = reference["sparse_sink_softmax_attention"]["scores"].copy()
    expected_scores[0, 1, :, 128] = 0.0
    reference["sparse_sink_softmax_attention"]["scores"] = expected_scores
    scores = expected_scores.copy()
    scores[0, 1, :, 129] = 0.0
    ids = _read_back(g, scores, reference)
    assert np.array_equal(ids, reference["candidate_assembly"]["candidates"])


def test_a_window_further_off_than_the_neighbours_searched_is_found_a_row_at_a_time():
    """Every query's dense window started from the step's first position: the s-th query's window is s places
    off, up to 8 in this step, beyond the NEAREST slots a single slot is searched. The device's scores (the
    oracle's attention over those candidates) are read back to exactly those candidates."""
    from csa_conform.explain.stages import run_stage
    from csa_conform.numerics.variant import Numerics

    case = "boundaries.r128-resumed-247-to-257"
    with GoldenFile(CI_GOLDENS) as golden:
        info, step = golden.case_info(case), golden.read_step(case, 0)
    g = validate_step(info.attrs, step.inputs, info.output_names)
    shifted = run_stage("candidate_assembly", g, step.inputs, step.stages,
                        Numerics(from_step_start=frozenset({"dense window"})))
    upstream = dict(step.stages, candidate_assembly=shifted)
    scores = run_stage("sparse_sink_softmax_attention", g, step.inputs, upstream, Numerics())["scores"]
    moved = shifted["candidates"] != step.stages["candidate_assembly"]["candidates"]
    assert g.sequence > 5 and moved[:, 5:].any()  # rows more than NEAREST places off
    ids = candidates_read_back(g, scores, None, None, step.stages, step.inputs["query"], step.inputs["current_kv"])
    assert np.array_equal(ids, shifted["candidates"])


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (1, 3, 1, 5), (2, 1, 4, 1), (1, 1, 1, 1), (2, 3, 1, 5)])
def test_the_slots_a_broadcast_bias_hides_are_those_of_the_whole_bias(shape):
    """Read once along each broadcast axis, the mask is the one the materialized [B,N,S,C] bias gives."""
    rng = np.random.default_rng(sum(shape))
    raw = rng.standard_normal(shape).astype(np.float32)
    raw[rng.random(shape) < 0.5] = -np.inf
    bias = np.broadcast_to(raw, (2, 3, 4, 5))
    assert np.array_equal(hidden_by_bias(bias), (np.ascontiguousarray(bias) == -np.inf).all(axis=1))
