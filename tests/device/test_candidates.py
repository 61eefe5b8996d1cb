"""Stage 6 read back from the fused attention launch's scores: a slot's id is corrected only by scores that
identify a key, never by the scores every key of zeros gets."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from csa_conform.contract import validate_step
from csa_conform.device.candidates import candidates_read_back
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
