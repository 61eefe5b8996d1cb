"""An earlier sub-step's values at the differing elements: stated as an observation where the device holds, bit
for bit, the reference's output of a sub-step before the stage's last, and refused on too few elements or on
values that are only near it."""

from __future__ import annotations

import numpy as np

from csa_conform.explain.claims import OBSERVATION
from csa_conform.explain.earlier import earlier_sub_step
from csa_conform.explain.patterns import SUB_STEP
from csa_conform.explain.probes import oracle_probes
from csa_conform.numerics.records import decode_fp8_record

from ci_steps import explain_payload, first_step

QUERY = "index_query_finalize"
COMPRESSOR = "compression_update"


def _query_with_hadamard_tail(count=None):
    """The query payload whose last 64 dims hold the reference's Hadamard output (the FP4 round trip skipped
    there), in the first ``count`` differing elements only when given."""
    g, inputs, expected = first_step("boundaries.r4-prefill-9")
    hadamard = oracle_probes(QUERY, g, inputs, expected)["hadamard"]
    reference = np.asarray(expected[QUERY]["transformed"])
    device = reference.copy().reshape(hadamard.shape)
    device[..., 64:] = hadamard[..., 64:]
    device = device.reshape(reference.shape)
    if count is not None:
        flat, kept = device.reshape(-1), reference.reshape(-1)
        differing = np.flatnonzero(flat.view(np.uint32) != kept.view(np.uint32))
        flat[differing[count:]] = kept[differing[count:]]
    return g, inputs, expected, {"transformed": device}


def test_query_values_that_are_the_reference_hadamard_output_say_the_fp4_round_trip_is_not_applied():
    g, inputs, expected, device = _query_with_hadamard_tail()
    reference = np.asarray(expected[QUERY]["transformed"])
    differing = int(np.count_nonzero(reference.view(np.uint32) != device["transformed"].view(np.uint32)))
    finding = earlier_sub_step(QUERY, g, inputs, expected, expected[QUERY], device)
    assert finding is not None and finding.kind == SUB_STEP and finding.established_by == OBSERVATION
    assert finding.evidence["held"] == "Hadamard" and finding.evidence["not_applied"] == ["FP4 round trip"]
    assert finding.covered == finding.differing == differing and finding.decisive
    assert finding.headline.startswith(f"at the {differing:,} differing elements of transformed the device holds the "
                                       "reference's Hadamard output, before the FP4 round trip")
    explanation = explain_payload(QUERY, g, inputs, expected, device)
    assert explanation.diagnosis[0] is not None and explanation.diagnosis[0].evidence.get("held") == "Hadamard"
    assert "the FP4 round trip is not applied there" in explanation.headline()


def test_a_few_such_elements_are_no_observation():
    g, inputs, expected, device = _query_with_hadamard_tail(count=4)
    assert earlier_sub_step(QUERY, g, inputs, expected, expected[QUERY], device) is None


def test_values_only_near_the_earlier_output_are_no_observation():
    g, inputs, expected, device = _query_with_hadamard_tail()
    moved = device["transformed"].view(np.uint32)
    reference = np.asarray(expected[QUERY]["transformed"]).view(np.uint32)
    moved[moved != reference] ^= 1  # one ulp off the Hadamard output everywhere it differs
    assert earlier_sub_step(QUERY, g, inputs, expected, expected[QUERY], device) is None


def test_f32_records_holding_the_rope_output_say_the_fp8_quantization_is_not_applied():
    g, inputs, expected = first_step("edges.r128-f32-b2-block-end-in-step")
    probes = oracle_probes(COMPRESSOR, g, inputs, expected)
    rope = probes["rmsnorm"].copy()
    rope[..., -g.rope_dim:] = probes["rope"]
    device = {name: np.array(array, copy=True) for name, array in expected[COMPRESSOR].items()}
    past = inputs["past_compressed_kv"].shape[1]
    device["present_compressed_kv"][:, past:] = rope
    finding = earlier_sub_step(COMPRESSOR, g, inputs, expected, expected[COMPRESSOR], device)
    assert finding is not None and finding.tensor == "present_compressed_kv"
    assert finding.evidence["held"] == "RoPE" and finding.evidence["not_applied"] == ["FP8 block quantization"]
    # the reference's own records are the FP8 round trip of those values: nothing differs where it is exact
    decoded = np.asarray(expected[COMPRESSOR]["present_compressed_kv"])[:, past:]
    assert finding.differing == int(np.count_nonzero(decoded.view(np.uint32) != rope.view(np.uint32)))


def test_packed_records_are_compared_decoded():
    g, inputs, expected = first_step("boundaries.r4-prefill-9")
    records = np.asarray(expected[COMPRESSOR]["present_compressed_kv"])
    assert records.dtype == np.uint8 and decode_fp8_record(records).shape[-1] == 512
    device = {name: np.array(array, copy=True) for name, array in expected[COMPRESSOR].items()}
    device["present_compressed_kv"][..., 0] ^= 1  # a scale byte one step off: no sub-step's output
    assert earlier_sub_step(COMPRESSOR, g, inputs, expected, expected[COMPRESSOR], device) is None


def test_a_step_that_completes_no_record_has_no_held_values():
    g, inputs, expected = first_step("boundaries.r4-prefill-3")
    device = {name: np.array(array, copy=True) for name, array in expected[COMPRESSOR].items()}
    carry = device["present_compression_carry"].view(np.uint32)
    carry[...] ^= 1
    assert np.asarray(expected[COMPRESSOR]["present_compressed_kv"]).shape[1] == 0
    assert earlier_sub_step(COMPRESSOR, g, inputs, expected, expected[COMPRESSOR], device) is None


def test_query_values_that_are_its_own_input_say_every_sub_step_is_not_applied():
    g, inputs, expected = first_step("boundaries.r4-prefill-9")
    raw = np.asarray(inputs["index_query"], dtype=np.float32)
    device = {"transformed": raw.reshape(np.shape(expected[QUERY]["transformed"])).copy()}
    finding = earlier_sub_step(QUERY, g, inputs, expected, expected[QUERY], device)
    assert finding is not None and finding.evidence["held"] == "input"
    assert finding.evidence["not_applied"] == ["bf16", "RoPE", "Hadamard", "FP4 round trip"]
    assert "the device holds the stage's index_query input as it is, before bf16, RoPE, the Hadamard and the FP4 round trip" in \
        finding.headline


def test_a_record_tail_rotated_at_position_0_names_only_rope_and_says_what_that_looks_like():
    """Ratio-4 main records rotated at position 0: their bf16 RoPE tail holds the RMSNorm output. The FP8
    quantization never touches the tail, so it is not among what was left out there; and a rotation at position 0
    leaves the same bytes as none, which the observation says."""
    from csa_conform.numerics.bf16 import bf16_bits

    g, inputs, expected = first_step("boundaries.r4-prefill-8")
    probes = oracle_probes(COMPRESSOR, g, inputs, expected)
    device = {name: np.array(array, copy=True) for name, array in expected[COMPRESSOR].items()}
    tails = device["present_compressed_kv"][:, inputs["past_compressed_kv"].shape[1]:, -2 * g.rope_dim:]
    tails[...] = np.ascontiguousarray(bf16_bits(probes["rmsnorm"][..., -g.rope_dim:])).view(np.uint8).reshape(
        tails.shape)
    finding = earlier_sub_step(COMPRESSOR, g, inputs, expected, expected[COMPRESSOR], device)
    assert finding.evidence["held"] == "RMSNorm" and finding.evidence["not_applied"] == ["RoPE"]
    assert ("the device holds the reference's RMSNorm output, before RoPE (bit for bit at 39 of 39): RoPE is not "
            "applied there, or RoPE applied at position 0, which rotates nothing") in finding.headline
    assert "FP8" not in finding.headline
