"""Every pattern function on degenerate inputs (issue 38): zero records completed, empty selections, one
element, B = 1, all -inf. None may raise; what they claim there must hold."""

from __future__ import annotations

import numpy as np
import pytest

from csa_conform.explain.patterns import Context, diagnose
from csa_conform.explain.patterns import factor, layout, permutation, quantization, restriction, shift, unwritten
from csa_conform.explain.patterns.substeps import localize
from csa_conform.explain.values import value_classes
from csa_conform.numerics.bits import differing_bits

from ci_steps import explain_payload, first_step

DETECTORS = (unwritten.never_written, unwritten.stale, layout.layout, layout.aliased, permutation.permuted,
             shift.index_shift, quantization.scale_exponent, quantization.query_scale_exponent,
             factor.constant_factor, restriction.restricted)
NEG_INF = np.float32(-np.inf)


def _degenerate():
    """(name, stage, tensor, reference, device, axes) of the shapes and values a step can have at its edges."""
    one = np.array([[[1.5]]], np.float32)
    ids = np.array([[[3, 7, -1, -1]]], np.int32)
    scores = np.full((1, 2, 8), NEG_INF)
    return [
        ("no record completed", "compression_update", "present_compressed_kv", np.zeros((1, 0, 583), np.uint8),
         np.zeros((1, 0, 583), np.uint8), ("b", "r", "byte")),
        ("an empty selection", "selection", "selected", np.zeros((1, 0, 8), np.int32), np.zeros((1, 0, 8), np.int32),
         ("b", "s", "k")),
        ("one element", "x", "t", one, one * np.float32(2), ("b", "s", "d")),
        ("B = 1, one slot padded otherwise", "selection", "selected", ids, np.where(ids < 0, 0, ids).astype(np.int32),
         ("b", "s", "k")),
        ("all -inf, the device 0", "index_scoring", "scores", scores, np.zeros_like(scores), ("b", "s", "c")),
        ("all -inf on both sides", "index_scoring", "scores", scores, scores.copy(), ("b", "s", "c")),
        ("NaN where the reference holds -inf", "index_scoring", "scores", scores, np.full_like(scores, np.nan),
         ("b", "s", "c")),
        ("one FP4 record, one scale byte off", "index_key_update", "present_index_key",
         np.full((1, 1, 68), 0x22, np.uint8), np.where(np.arange(68) == 0, 0x23, 0x22).astype(np.uint8)[None, None],
         ("b", "r", "byte")),
    ]


@pytest.mark.parametrize("case", _degenerate(), ids=lambda case: case[0])
def test_every_detector_and_the_value_classes_take_a_degenerate_tensor(case):
    name, stage, tensor, reference, device, axes = case
    differ = differing_bits(reference, device)
    context = Context(stage, inputs={"past_compressed_kv": np.zeros((1, 0, 583), np.uint8),
                                     "past_index_key": np.zeros((1, 0, 68), np.uint8)})
    for detector in DETECTORS:
        found = detector(stage, tensor, reference, device, differ, axes, context)
        assert found is None or found.differing == int(differ.sum()), (detector.__name__, found)
    findings = diagnose(stage, {tensor: reference}, {tensor: device}, {tensor: axes}, context)
    claimed = {finding.kind for finding in findings}
    assert claimed <= {"restricted"}, (name, [finding.headline for finding in findings])  # nothing to beat chance
    claims, lines = value_classes({tensor: reference}, {tensor: device})
    assert all(claim.support == int(differ.sum()) for claim in claims)
    if name == "all -inf, the device 0":
        assert [claim.text for claim in claims] == ["scores: the device holds 0 where the reference holds -inf, "
                                                    "16 of 16"]
    if name == "B = 1, one slot padded otherwise":
        assert claims[0].text == "selected: the device holds 0 where the reference holds -1, 2 of 2"
    if not differ.any():
        assert not claims and not lines and not findings


def test_localize_takes_a_step_that_completes_no_record_and_one_that_completes_them_all_unchanged():
    """The crash of issue 38: present records that differ only among the past ones, none completed in the
    step (ValueError: cannot reshape array of size 0 into shape (1,0,newaxis))."""
    g, inputs, stages = first_step("boundaries.r128-resumed-119-chunks")
    reference = stages["compression_update"]
    held = reference["present_compressed_kv"]
    inputs = dict(inputs, past_compressed_kv=held)
    device = {name: np.array(array, copy=True) for name, array in reference.items()}
    device["present_compressed_kv"][0, 0, 3] ^= 1
    assert localize("compression_update", g, inputs, reference, device) is None
    assert localize("compression_update", g, inputs, reference, reference) is None
    assert localize("selection", g, inputs, reference, device) is None


def test_a_step_that_completes_no_record_with_a_wrong_carry_is_explained_without_a_crash():
    g, inputs, stages = first_step("boundaries.r4-decode-1-to-5")
    stage = "compression_update"
    assert np.shape(stages[stage]["present_compressed_kv"])[1] == 0
    payload = {name: np.array(array, copy=True) for name, array in stages[stage].items()}
    carry = payload["present_compression_carry"]
    carry[0, 0, 0, :16] = np.float32(0.123)
    explanation = explain_payload(stage, g, inputs, stages, payload)
    assert explanation.verdict != "failed", explanation.note
    assert all(finding.kind != "sub-step" for finding in explanation.diagnosis)
