"""Each structural detector on payloads built to show its pattern, and on patterns it must not claim."""

from __future__ import annotations

import numpy as np

from csa_conform.explain.patterns import (
    CONSTANT_FACTOR,
    GUARD_READ,
    INDEX_SHIFT,
    KINDS,
    NEVER_WRITTEN,
    PERMUTATION,
    RESTRICTED,
    ROW_ALIASING,
    SCALE_EXPONENT,
    STALE,
    SUB_STEP,
    Context,
    diagnose,
)
from csa_conform.device.guards import BAND_BYTES, GUARD_BYTE
from csa_conform.explain.patterns.factor import simple_form
from csa_conform.explain.patterns.findings import SOURCE, spans
from csa_conform.explain.patterns.unwritten import BAND_RUN, RUN
from csa_conform.numerics.fp4 import e2m1_decode, e2m1_encode
from csa_conform.spec import POISON

from ci_steps import first_step

RNG = np.random.default_rng(16)


def _kinds(stage, tensor, expected, actual, axes, context=None):
    findings = diagnose(stage, {tensor: expected}, {tensor: actual}, {tensor: axes}, context or Context(stage))
    return findings


def test_spans_compacts_ranges():
    assert spans([0, 1, 2, 3, 7, 9, 10, 11, 12]) == "0..3, 7, 9..12"


def test_never_written_finds_the_poison_and_where_it_is():
    expected = RNG.standard_normal((1, 8, 2, 16)).astype(np.float32)
    actual = expected.copy()
    actual[0, 5:] = np.frombuffer(b"\xa5" * 4, np.float32)[0]
    finding = _kinds("compression_update", "present_compression_carry", expected, actual, ("b", "slot", "ch", "d"))[0]
    assert finding.kind == NEVER_WRITTEN and finding.decisive
    assert finding.evidence["poisoned"] == 3 * 2 * 16 and finding.evidence["where"] == {"slot": "5..7"}
    # a kernel copying from memory it never wrote (a carry rotated from slots never filled) leaves the same bytes
    assert "never written, or copied from memory never written" in finding.headline
    assert "was never written" not in finding.headline


def test_guard_band_bytes_read_back_are_a_copy_from_outside_a_buffer():
    expected = RNG.integers(0, 256, (2, 2, 68), dtype=np.uint8)
    actual = expected.copy()
    actual[0, 1, :64] = GUARD_BYTE  # a past record read at the present's row stride, past the past's end
    finding = _kinds("index_key_update", "present_index_key", expected, actual, ("b", "r", "byte"))[0]
    assert finding.kind == GUARD_READ and finding.evidence["where"] == {"b": "0", "r": "1"}
    assert "read them from outside a buffer" in finding.headline and finding.to_dict()["source"] == "transform"
    assert all(found.kind != GUARD_READ for found in
               _kinds("index_key_update", "present_index_key", expected, expected ^ np.uint8(1), ("b", "r", "byte")))


def test_any_buffers_band_byte_is_a_guard_read_and_the_headline_names_the_bytes_found():
    expected = RNG.standard_normal((2, 4, 16)).astype(np.float32)
    actual = expected.copy()
    actual[1, 2, 8:] = np.frombuffer(bytes([BAND_BYTES[5]]) * 4, np.float32)[0]
    actual[0, 3, :2] = np.frombuffer(bytes([GUARD_BYTE]) * 4, np.float32)[0]
    actual[0, 0, 0] = np.frombuffer(bytes([0xD0, 0xD0, 0xD0, 0xD1]), np.float32)[0]  # not one byte repeated
    finding = _kinds("compression_update", "present_compression_carry", expected, actual, ("b", "slot", "d"))[0]
    assert finding.kind == GUARD_READ and finding.evidence["copied"] == 10
    assert finding.evidence["pattern"] == "0xD0, 0xDB" and "guard-band bytes (0xD0, 0xDB) in 10 of 11" in \
        finding.headline


def test_four_equal_band_codes_in_a_record_are_no_guard_read_eight_are():
    """Quantized data repeats codes: a run of four of one of the sixteen band bytes (an E4M3 -22) is a
    coincidence, not a read from outside a buffer; a run of BAND_RUN is claimed. Four poison bytes (a scale never
    written), one byte, still are."""
    expected = RNG.integers(0, 0xA0, (1, 4, 64), dtype=np.uint8)
    actual = expected.copy()
    actual[0, 1, 8:12] = GUARD_BYTE
    assert not any(found.kind == GUARD_READ for found in
                   _kinds("index_key_update", "present_index_key", expected, actual, ("b", "r", "byte")))
    actual[0, 2, 20:20 + RUN] = POISON
    actual[0, 3, 30:30 + BAND_RUN] = BAND_BYTES[3]
    [finding] = [found for found in _kinds("index_key_update", "present_index_key", expected, actual,
                                           ("b", "r", "byte")) if found.kind == GUARD_READ]
    assert finding.evidence["copied"] == BAND_RUN and finding.evidence["pattern"] == "0xDE"
    assert any(found.kind == NEVER_WRITTEN and found.evidence["poisoned"] == RUN for found in
               _kinds("index_key_update", "present_index_key", expected, actual, ("b", "r", "byte")))


def test_stale_finds_past_values_copied_through():
    past = RNG.standard_normal((1, 8, 2, 16)).astype(np.float32)
    expected = past + np.float32(1)
    actual = expected.copy()
    actual[0, :4] = past[0, :4]
    context = Context("compression_update", inputs={"past_compression_carry": past})
    finding = _kinds("compression_update", "present_compression_carry", expected, actual, ("b", "slot", "ch", "d"),
                     context)[0]
    assert finding.kind == STALE and finding.evidence == {"source": "past_compression_carry", "kept": 4 * 32,
                                                          "where": {"slot": "0..3"}}


def test_permutations_nibbles_pairs_reversal():
    codes = RNG.integers(0, 256, (1, 2, 68), dtype=np.uint8)
    swapped = ((codes >> 4) | (codes << 4)).astype(np.uint8)
    finding = _kinds("index_key_update", "present_index_key", codes, swapped, ("b", "r", "byte"))[0]
    assert finding.kind == PERMUTATION and finding.evidence["pattern"] == "nibbles swapped"
    values = RNG.standard_normal((2, 3, 128)).astype(np.float32)
    pairs = values.reshape(2, 3, 64, 2)[..., ::-1].reshape(values.shape)
    assert _kinds("index_query_finalize", "transformed", values, pairs, ("b", "s", "d"))[0].evidence["pattern"] == \
        "pairs swapped"
    ids = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    finding = _kinds("selection", "selected", ids, ids[..., ::-1].copy(), ("b", "s", "k"))[0]
    assert finding.kind == PERMUTATION and finding.evidence["pattern"] == "row reversed"


def test_a_flush_to_zero_is_no_permutation():
    values = np.array([[1e-40, 0.0, 2.0, 3.0]], np.float32)
    flushed = np.array([[0.0, 0.0, 2.0, 3.0]], np.float32)
    assert all(finding.kind != PERMUTATION for finding in _kinds("x", "t", values, flushed, ("s", "d")))


def test_index_shift_names_axis_and_offset():
    ids = (100 + np.arange(2 * 16)).reshape(2, 16).astype(np.int32)
    early = ids - 1
    finding = _kinds("candidate_assembly", "candidates", ids, early, ("s", "c"))[0]
    assert finding.kind == INDEX_SHIFT and finding.evidence["axis"] == "c" and finding.evidence["shift"] == -1
    assert "device c=k holds the reference's c=k-1" in finding.headline


def test_values_held_twice_along_an_axis_are_no_shift():
    """A ratio-4 carry whose slots 4..7 were not cleared after the rotation keeps there what slots 0..3 now hold:
    slot k holds the reference's slot k-4, but slot k-4 still holds it too. A shift would have moved those on."""
    carry = RNG.standard_normal((3, 8, 8)).astype(np.float32)
    kept = carry.copy()
    kept[0, 4:] = carry[0, :4]  # one batch row completed a block: no row of slots aliases across the batch
    (finding,) = [f for f in _kinds("compression_update", "present_compression_carry", carry, kept, ("b", "slot", "d"))
                  if f.kind in (INDEX_SHIFT, ROW_ALIASING)]
    assert finding.kind == ROW_ALIASING and finding.evidence["twice"] and finding.evidence["shift"] == -4
    assert ("present_compression_carry holds values twice along slot: device slot=k holds the reference's slot=k-4 "
            "in 32 of 32 differing elements") in finding.headline
    assert "slot=k-4 keeps them too" in finding.headline


def test_constant_factor_names_a_simple_form_and_ignores_rounding_noise():
    values = RNG.standard_normal((2, 8)).astype(np.float32)
    scaled = (values * np.float32(1 / np.sqrt(2))).astype(np.float32)
    finding = _kinds("index_scoring", "scores", values, scaled, ("s", "c"))[0]
    assert finding.kind == CONSTANT_FACTOR and finding.evidence["form"] == "1/sqrt(2)"
    noisy = np.nextafter(values, np.float32(np.inf))
    assert all(finding.kind != CONSTANT_FACTOR for finding in _kinds("x", "scores", values, noisy, ("s", "c")))
    assert simple_form(3.0, Context("x")) is None


def _fp8_records(x, tail, step=None):
    """FP8 records [1, R, 583] of block inputs x [1, R, 7, 64]; ``step`` [1, R, 7] moves the exponents."""
    from csa_conform.numerics.blockscale import block_power
    from csa_conform.numerics.e8m0 import e8m0_encode, power_of_two
    from csa_conform.numerics.fp8 import e4m3_encode
    from csa_conform.numerics.records import pack_fp8_record

    amax = np.maximum(np.abs(x).max(axis=-1), np.float32(1e-4))
    power = block_power(amax, 448.0) + (0 if step is None else step)
    codes = e4m3_encode(np.clip(x / power_of_two(power)[..., None], -448, 448).astype(np.float32))
    return pack_fp8_record(e8m0_encode(power), codes, tail)


def test_scale_exponent_claimed_only_where_the_block_input_requantized_at_that_exponent_is_the_devices_codes():
    x = RNG.standard_normal((1, 2, 7, 64)).astype(np.float32)
    tail = RNG.standard_normal((1, 2, 64)).astype(np.float32)
    expected = _fp8_records(x, tail)
    step = np.zeros((1, 2, 7), np.int64)
    step[0, 0, [1, 4]] = 1
    context = Context("compression_update", inputs={"past_compressed_kv": np.zeros((1, 0, 583), np.uint8)},
                      tracer=lambda: {"FP8 E4M3 block input": [x]})
    axes = ("b", "r", "byte")
    finding = _kinds("compression_update", "present_compressed_kv", expected, _fp8_records(x, tail, step), axes,
                     context)[0]
    assert finding.kind == SCALE_EXPONENT and finding.evidence["blocks"] == 2 and finding.evidence["steps"] == [1]
    assert finding.confidence == "strong" and "bit for bit" in finding.headline
    # values scaled before the quantization move the exponents too, but their codes are no exponent's of x
    scaled = _fp8_records(x * np.float32(2.5), tail)
    kinds = {f.kind for f in _kinds("compression_update", "present_compressed_kv", expected, scaled, axes, context)}
    assert SCALE_EXPONENT not in kinds
    # without the oracle's block inputs nothing can be requantized: no claim
    bare = Context("compression_update", inputs=context.inputs)
    kinds = {f.kind for f in _kinds("compression_update", "present_compressed_kv", expected,
                                    _fp8_records(x, tail, step), axes, bare)}
    assert SCALE_EXPONENT not in kinds


def _query_round_trip(x, powers):
    """x[..., 32 * k] through FP4 E2M1 at the given E8M0 exponents, one per block of 32."""
    blocks = x.reshape(x.shape[:-1] + (-1, 32))
    scale = np.ldexp(np.float32(1), powers).astype(np.float32)[..., None]
    return (e2m1_decode(e2m1_encode(np.clip(blocks / scale, -6, 6))) * scale).reshape(x.shape).astype(np.float32)


def test_a_query_block_at_frexpf_exponent_is_a_scale_exponent_exactly_at_its_power_of_two():
    x = RNG.standard_normal((1, 2, 1, 128)).astype(np.float32)
    x[0, 1, 0, 32:64] = np.linspace(-0.95, 0.95, 32, dtype=np.float32)  # codes that move with the exponent
    x[0, 1, 0, 40] = 3.0  # amax / 6 = 2^-1: ceil(log2) is -1, frexpf's exponent 0
    amax = np.abs(x.reshape(1, 2, 1, 4, 32)).max(axis=-1)
    ceil, frexp = np.ceil(np.log2(amax / 6)).astype(int), np.frexp(amax / np.float32(6))[1]
    assert (ceil != frexp).sum() == 1
    expected, actual = _query_round_trip(x, ceil), _query_round_trip(x, frexp)
    assert np.count_nonzero(expected != actual) >= 8  # MIN_SUPPORT: one block's worth of moved values
    context = Context("index_query_finalize", tracer=lambda: {"FP4 E2M1 block input": [x.reshape(2, 1, 4, 32)]})
    axes = ("b", "s", "i", "d")
    finding = _kinds("index_query_finalize", "transformed", expected, actual, axes, context)[0]
    assert finding.kind == SCALE_EXPONENT and finding.evidence["steps"] == [1] and finding.evidence["blocks"] == 1
    assert finding.evidence["power_of_two"] == finding.evidence["power_of_two_blocks"] == 1
    assert finding.evidence["query_rows"] == "1" and finding.evidence["structural"]
    nudged = expected.copy()
    nudged[0, 1, 0, 32:64] = np.nextafter(nudged[0, 1, 0, 32:64], np.float32(np.inf))
    kinds = {f.kind for f in _kinds("index_query_finalize", "transformed", expected, nudged, axes, context)}
    assert SCALE_EXPONENT not in kinds


def test_restricted_names_batch_rows_and_the_device_value():
    expected = RNG.standard_normal((3, 2, 8)).astype(np.float32)
    actual = expected.copy()
    actual[1:, 1, 2:6] = -np.inf
    finding = next(f for f in _kinds("x", "scores", expected, actual, ("b", "s", "c")) if f.kind == RESTRICTED)
    assert any(p.startswith("batch rows b >= 1") for p in finding.evidence["predicates"])
    assert finding.evidence["value"] == "-inf" and finding.evidence["where"] == {"b": "1..2", "s": "1", "c": "2..5"}


def test_a_few_differing_elements_are_an_observation_of_where_they_sit_not_a_predicate():
    """Two elements at b >= 1 fit "batch rows b >= 1" as well as any coincidence; and one batch index is a
    place, not a rule, however many elements differ there."""
    expected = RNG.standard_normal((3, 2, 4)).astype(np.float32)
    actual = expected.copy()
    actual[1:, 1, 2] = -np.inf
    finding = next(f for f in _kinds("x", "scores", expected, actual, ("b", "s", "c")) if f.kind == RESTRICTED)
    assert finding.evidence["predicates"] == [] and finding.confidence == "observed"
    assert finding.headline.startswith("the 2 elements of scores that differ sit at b = 1..2, s = 1, c = 2")
    two = RNG.standard_normal((2, 4, 8)).astype(np.float32)
    moved = two.copy()
    moved[1] += 1
    finding = next(f for f in _kinds("x", "scores", two, moved, ("b", "s", "c")) if f.kind == RESTRICTED)
    assert finding.evidence["predicates"] == [] and "sit at b = 1" in finding.headline


def test_kinds_are_documented_and_in_the_schema():
    from pathlib import Path

    from csa_conform.check.results import schema

    text = (Path(__file__).resolve().parents[2] / "specs" / "diagnosis.md").read_text()
    assert all(f"| `{kind}` |" in text for kind in KINDS)
    assert set(SOURCE) == set(KINDS)  # every kind says what establishes it
    assert schema()["$defs"]["finding"]["properties"]["kind"]["enum"] == list(KINDS)


def test_one_rope_tail_byte_a_bf16_step_off_is_consistent_with_every_sub_step_and_names_none():
    """What the CUDA seed's kernels do at large positions (device cosf/powf): one bf16 of the RoPE tail
    one step off; the head's codes and the tail's energy are the reference's. A difference that small at the
    pool, bf16 or RMSNorm fits the same bytes, and so does the record's packing, whose codes bound the fit: the
    finding lists them all and names no sub-step."""
    from csa_conform.explain.patterns.substeps import STREAMED, localize

    g, inputs, stages = first_step("boundaries.r128-resumed-119-chunks")
    reference = stages["compression_update"]
    device = {name: np.array(array, copy=True) for name, array in reference.items()}
    device["present_compressed_kv"][0, -1, 583 - 2] ^= 0x01  # the low byte of the last tail bf16
    found = localize("compression_update", g, inputs, reference, device)
    assert found.kind == SUB_STEP and found.evidence["sub_step"] is None and found.evidence["rule"] == "rope"
    assert found.evidence["consistent"] == [STREAMED, "pool", "bf16", "RMSNorm", "RoPE", "FP8 block quantization"]
    assert "tail's energy is the reference's within them (measured 1.00× the reference's, the bound ±2%)" in \
        found.headline
    assert found.decisive
    assert ("pool, bf16, RMSNorm, RoPE or FP8 block quantization output, or in the rows streamed into the carry "
            "that the pool reads") in \
        found.headline and "not separable" in found.headline
    assert found.confidence != "strong" and found.to_dict()["source"] == "fit"
    assert found.evidence["first"] == [0, device["present_compressed_kv"].shape[1] - 1]


def test_a_record_of_zeros_is_no_multiple_of_the_reference():
    """Codes all zero under the reference's scales (an FP8 record), or every byte zero (an FP4 key: scales of
    2^-127, values within the quantization error of zero): "the reference's RoPE output times 0" fits anything,
    so no constant is fitted and the record matches no sub-step."""
    from csa_conform.explain.patterns.substeps import localize

    for case, stage, tensor, kept in (("boundaries.r128-resumed-119-chunks", "compression_update",
                                       "present_compressed_kv", [block * 65 for block in range(7)]),
                                      ("random.r4-bias-1", "index_key_update", "present_index_key", [])):
        g, inputs, stages = first_step(case)
        reference = stages[stage]
        device = {name: np.array(array, copy=True) for name, array in reference.items()}
        record = device[tensor][0, -1]
        zeroed = np.ones(record.shape, bool)
        zeroed[kept] = False
        record[zeroed] = 0
        found = localize(stage, g, inputs, reference, device)
        assert found.evidence["rule"] == "none" and "factor" not in found.evidence, (case, found.headline)


def test_a_record_written_at_another_records_place_or_left_unwritten_is_no_sub_step_fit():
    """Batch row 1's record written at row 0's offset (a row stride swapped) and row 1's place never written:
    the records were computed right, so no sub-step is fitted; aliasing states the fact."""
    from csa_conform.explain.patterns.substeps import localize

    g, inputs, stages = first_step("edges.r128-fp8-b2n5-sinks")
    reference = stages["compression_update"]
    device = {name: np.array(array, copy=True) for name, array in reference.items()}
    records = device["present_compressed_kv"]
    records[0, 0], records[1, 0] = reference["present_compressed_kv"][1, 0], 0xA5
    assert localize("compression_update", g, inputs, reference, device) is None
    records[1, 0] = reference["present_compressed_kv"][1, 0]  # row 0 alone holds row 1's record: still no fit
    assert localize("compression_update", g, inputs, reference, device) is None
    records[1, 0] = 0xA5
    finding = _kinds("compression_update", "present_compressed_kv", reference["present_compressed_kv"], records,
                     ("b", "r", "byte"))[0]
    assert finding.kind == "row-aliasing" and finding.evidence["rows"] == {0: 1}
    assert finding.evidence["unwritten"] == [1] and finding.decisive and "b 1 never written" in finding.headline


def test_a_head_code_rounded_the_other_way_is_localized_at_the_quantization_and_matching_stages_at_nothing():
    """A code moved to the other grid value bracketing the reference's quantizer input: only the
    quantization differs. A code moved away from its input is not a quantization difference."""
    from csa_conform.explain.patterns.substeps import STREAMED, _record_chain, localize
    from csa_conform.numerics.fp8 import e4m3_decode

    g, inputs, stages = first_step("boundaries.r128-resumed-119-chunks")
    reference = stages["compression_update"]
    assert localize("compression_update", g, inputs, reference, reference) is None
    normalized = _record_chain("compression_update", g, inputs)[0][0, -1]
    record = reference["present_compressed_kv"][0, -1]
    scale = 2.0 ** (int(record[0]) - 127)
    codes = np.abs(e4m3_decode(record[1:65])).astype(np.float64)
    between = np.abs(normalized[:64]) / scale != codes  # the input lies strictly between two codes
    byte = 1 + int(np.argmax(((record[1:65] & 0x7F) > 8) & ((record[1:65] & 0x7F) < 0x7E) & between))
    toward = 1 if abs(normalized[byte - 1]) / scale > abs(float(e4m3_decode(record[byte]))) else -1
    for step, sub_step in ((toward, "FP8 block quantization"), (-toward, None)):
        device = {name: np.array(array, copy=True) for name, array in reference.items()}
        device["present_compressed_kv"][0, -1, byte] = int(record[byte]) + step
        found = localize("compression_update", g, inputs, reference, device)
        if sub_step:
            assert found.evidence["rule"] == "quantizer" and found.evidence["sub_step"] is None
            assert found.evidence["consistent"] == [STREAMED, "pool", "bf16", "RMSNorm", "RoPE", sub_step]
        else:
            assert found.evidence["rule"] != "quantizer"


def _padded_ids(rows=6, width=8, seed=3):
    """Rows of distinct record ids, each a prefix of 3 to 6 valid entries padded with -1."""
    rng = np.random.default_rng(seed)
    ids = np.full((1, rows, width), -1, np.int32)
    for s in range(rows):
        ids[0, s, :3 + s % 4] = rng.choice(1000, 3 + s % 4, replace=False)
    return ids


def _reversed_from(ids, start=0):
    device = ids.copy()
    for s in range(ids.shape[1]):
        valid = np.flatnonzero((ids[0, s] != -1) & (np.arange(ids.shape[2]) >= start))
        device[0, s, valid] = ids[0, s, valid[::-1]]
    return device


def test_padded_rows_reversed_in_their_valid_entries_are_that_order():
    ids = _padded_ids()
    finding = _kinds("selection", "selected", ids, _reversed_from(ids), ("b", "s", "k"))[0]
    assert finding.kind == PERMUTATION and finding.evidence["pattern"] == "valid entries reversed"
    assert finding.confidence == "strong" and finding.evidence["rows"] == 6 and finding.evidence["from"] == 0


def test_a_span_after_the_dense_slots_reversed_names_where_it_starts():
    ids = _padded_ids(width=12)
    ids[0, :, :4] = np.arange(4)  # slots every row holds alike, before the span
    ids[0, :, 4:] = _padded_ids(width=8, seed=5)[0]
    finding = _kinds("candidate_assembly", "candidates", ids, _reversed_from(ids, 4), ("b", "s", "c"))[0]
    assert finding.evidence["pattern"] == "valid entries reversed" and finding.evidence["from"] == 4
    assert "from c = 4" in finding.headline


def test_a_selection_in_ascending_score_order_is_named_with_ties_by_id():
    ids = _padded_ids()
    scores = np.zeros((1, 6, 1000), np.float32)
    device = ids.copy()
    for s in range(6):
        valid = ids[0, s][ids[0, s] != -1]
        scores[0, s, valid] = np.arange(len(valid))[::-1] // 2  # descending in the reference's order, with ties
        device[0, s, :len(valid)] = sorted(valid, key=lambda r, s=s: (scores[0, s, r], r))
    context = Context("selection", expected={"index_scoring": {"scores": scores}})
    finding = _kinds("selection", "selected", ids, device, ("b", "s", "k"), context)[0]
    assert finding.evidence["pattern"] == "ascending by score"
    # without the scores nothing canonical fits: the reordering is all that is said
    plain = _kinds("selection", "selected", ids, device, ("b", "s", "k"))[0]
    assert plain.evidence["pattern"] == "reordered"


def test_two_sorted_runs_written_the_other_way_round_are_a_rotation_not_a_sort():
    """Ratio-128 candidates are the dense window's positions, then the records' ids: a kernel that puts the records
    first leaves a row that happens to be sorted; the sort is no evidence of sorting, the rotation is the fact."""
    ids = np.full((1, 4, 36), -1, np.int32)
    ids[0, :, :32] = np.arange(32)
    for s in range(4):
        ids[0, s, 32:33 + s] = np.arange(1 + s)
    device = ids.copy()
    for s in range(4):
        device[0, s, :33 + s] = np.concatenate([ids[0, s, 32:33 + s], ids[0, s, :32]])
    finding = _kinds("candidate_assembly", "candidates", ids, device, ("b", "s", "c"))[0]
    assert finding.kind == PERMUTATION and finding.evidence["pattern"] == "valid entries rotated"
    assert finding.evidence["equally"] == [] and "its last 1..4 put ahead of the others" in finding.headline
    assert "sorted" not in finding.headline
    # runs that do not fall into order when rotated: the sort is still claimed where it alone fits
    ids[0, :, :32] = np.arange(32)[::-1] + 100
    device = ids.copy()
    for s in range(4):
        device[0, s, :33 + s] = np.sort(ids[0, s, :33 + s])
    assert _kinds("candidate_assembly", "candidates", ids, device, ("b", "s", "c"))[0].evidence["pattern"] == \
        "sorted by id"


def test_one_rows_reordering_is_an_observation_and_two_distinct_rows_a_finding():
    """Tied values make one row's reordering a coincidence too often (a rotation of tied RoPE pairs lands on the
    same multiset): one row, or rows holding the same values, is said as a fact, not claimed as the kernel's."""
    row = RNG.standard_normal(64).astype(np.float32)
    shuffled = row[RNG.permutation(64)]
    expected = np.stack([row, row])[None]
    one = expected.copy()
    one[0, 0] = shuffled
    same = np.stack([shuffled, shuffled])[None]
    for device in (one, same):
        finding = _kinds("index_key_update", "logical_keys", expected, device, ("b", "r", "d"))[0]
        assert finding.kind == PERMUTATION and finding.established_by == "observation"
    other = RNG.standard_normal(64).astype(np.float32)
    expected = np.stack([row, other])[None]
    device = np.stack([shuffled, other[RNG.permutation(64)]])[None]
    finding = _kinds("index_key_update", "logical_keys", expected, device, ("b", "r", "d"))[0]
    assert finding.kind == PERMUTATION and finding.evidence["pattern"] == "reordered"
    assert finding.established_by != "observation"


def test_a_reversal_that_misses_one_row_is_not_claimed():
    ids = _padded_ids()
    device = _reversed_from(ids)
    device[0, 5, :4] = ids[0, 5, [1, 0, 3, 2]]  # this row reordered another way
    finding = _kinds("selection", "selected", ids, device, ("b", "s", "k"))[0]
    assert finding.kind == PERMUTATION and finding.evidence["pattern"] == "reordered"


def test_a_few_reordered_ids_are_an_observation_naming_no_order():
    ids = _padded_ids()
    device = ids.copy()
    device[0, 2, :2] = ids[0, 2, [1, 0]]
    device[0, 4, :2] = ids[0, 4, [1, 0]]
    finding = _kinds("selection", "selected", ids, device, ("b", "s", "k"))[0]
    assert finding.kind == PERMUTATION and finding.established_by == "observation"
    assert finding.confidence == "observed" and finding.evidence["pattern"] == "reordered"
    assert finding.headline == ("each differing row of selected holds the reference row's values in another order "
                                "(2 of 2 rows; the 4 differing elements at k = 0..1)")
    other = ids.copy()
    other[0, 2, 0] = 999  # a value the reference's row does not hold: no reordering
    assert all(finding.kind != PERMUTATION for finding in _kinds("selection", "selected", ids, other, ("b", "s", "k")))


def test_scores_whose_slots_moved_are_an_observation_that_leaves_the_numeric_search_on():
    scores = np.full((1, 3, 2, 8), -np.inf, np.float32)
    scores[..., :5] = RNG.standard_normal((1, 3, 2, 5)).astype(np.float32)
    device = scores.copy()
    device[0, 1, 0, [0, 3]] = scores[0, 1, 0, [3, 0]]
    finding = _kinds("sparse_sink_softmax_attention", "scores", scores, device, ("b", "s", "h", "c"))[0]
    assert finding.kind == PERMUTATION and finding.established_by == "observation"
    assert finding.evidence["structural"] is False and "at c = 0, 3" in finding.headline
    device[0, 1, 0, 3] = np.nextafter(device[0, 1, 0, 3], np.float32(np.inf))  # one ulp off: no longer its value
    assert all(finding.kind != PERMUTATION for finding in
               _kinds("sparse_sink_softmax_attention", "scores", scores, device, ("b", "s", "h", "c")))
