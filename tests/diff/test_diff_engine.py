"""The diff engine: bit-pattern equality, ULP statistics, first divergence, record decoding."""

from __future__ import annotations

import json

import numpy as np
import pytest

from csa_conform.compare.bitwise import compare_payloads, compare_tensor, default_axes
from csa_conform.numerics.bf16 import bf16_bits, bf16_round
from csa_conform.numerics.fp4 import quantize_fp4_blocks
from csa_conform.numerics.fp8 import quantize_fp8_blocks
from csa_conform.numerics.records import pack_fp4_record, pack_fp8_record


def ulps_away(values: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """values moved by `steps` representable floats (toward +inf for positive values)."""
    bits = values.view(np.int32) + steps.astype(np.int32)
    return bits.view(np.float32)


def test_identical_tensors_pass_with_zero_ulp_everywhere():
    values = np.linspace(-3, 3, 64, dtype=np.float32).reshape(2, 32)
    diff = compare_tensor(values, values.copy(), stage="outputs", tensor="Y")
    assert diff.passed and diff.mismatches == 0 and diff.first is None
    assert diff.ulp == {"max": 0, "0": 64, "1": 0, "2": 0, ">2": 0, "nan_pairs": 0}


def test_identical_tensors_with_specials_report_what_a_one_ulp_tolerance_run_reports():
    """The shortcut for identical bytes must say what the full statistics say; the 1-ULP run takes the
    full path (its tolerance differs), so the two dictionaries come from different code."""
    values = np.array([[np.nan, -0.0, np.inf, 1e-45], [-np.inf, 2.5, np.nan, 0.0]], dtype=np.float32)
    quick = compare_tensor(values, values.copy(), stage="outputs", tensor="Y").to_dict()
    moved = values.copy()
    moved[1, 1] = np.nextafter(np.float32(2.5), np.float32(3))
    full = compare_tensor(values, moved, stage="outputs", tensor="Y", ulp=1).to_dict()
    assert full["passed"] and full["ulp"]["1"] == 1
    assert quick["ulp"] == {**full["ulp"], "max": 0, "0": full["ulp"]["0"] + 1, "1": 0}
    assert (quick["specials"], quick["max_abs_error"], quick["max_rel_error"]) == (full["specials"], 0.0, 0.0)
    assert quick["ulp"]["nan_pairs"] == 2


def test_ulp_distribution_counts_each_distance():
    expected = np.full(10, 1.5, dtype=np.float32)
    steps = np.array([0, 0, 0, 1, 1, 2, 3, 5, 0, 1])
    diff = compare_tensor(expected, ulps_away(expected, steps), stage="s", tensor="t")
    assert not diff.passed
    assert diff.mismatches == 6 == diff.failures
    assert diff.ulp == {"max": 5, "0": 4, "1": 3, "2": 1, ">2": 2, "nan_pairs": 0}
    assert diff.first["index"] == 3 and diff.first["ulp"] == 1


def test_signed_zero_is_a_one_ulp_divergence():
    diff = compare_tensor(np.zeros(3, np.float32), np.array([0.0, -0.0, 0.0], np.float32), stage="s", tensor="t")
    assert not diff.passed
    assert diff.first["expected_bits"] == "0x00000000" and diff.first["actual_bits"] == "0x80000000"
    assert diff.first["ulp"] == 1
    assert diff.specials["actual"]["-0"] == 1 and diff.specials["expected"]["-0"] == 0


def test_first_divergence_names_coordinates_by_axis():
    expected = np.zeros((1, 20, 4, 512), dtype=np.float32)
    actual = expected.copy()
    actual[0, 17, 3, 449] = 1.0
    actual[0, 19, 0, 0] = 2.0
    diff = compare_tensor(expected, actual, stage="sparse_sink_softmax_attention", tensor="Y")
    assert diff.axes == ("b", "s", "h", "d")
    assert diff.first["coords"] == "b=0 s=17 h=3 d=449"
    assert diff.first["index"] == np.ravel_multi_index((0, 17, 3, 449), expected.shape)
    assert diff.first["actual"] == 1.0 and diff.first["actual_bits"] == "0x3f800000"
    assert "b=0 s=17 h=3 d=449" in diff.summary()


def test_ulp_relaxation_applies_to_float_tensors_only():
    expected = np.full(4, 2.0, dtype=np.float32)
    actual = ulps_away(expected, np.array([0, 1, 1, 2]))
    relaxed = compare_tensor(expected, actual, stage="s", tensor="t", ulp=1)
    assert not relaxed.passed and relaxed.mismatches == 3 and relaxed.failures == 1
    assert relaxed.first["index"] == 3
    assert compare_tensor(expected, actual, stage="s", tensor="t", ulp=2).passed

    codes = np.arange(8, dtype=np.uint8)
    assert not compare_tensor(codes, codes + 1, stage="s", tensor="t", ulp=100).passed
    indices = np.arange(6, dtype=np.int32).reshape(2, 3)
    shifted = compare_tensor(indices, indices + 1, stage="selection", tensor="selected", ulp=100)
    assert not shifted.passed and shifted.ulp_tolerance == 0


def test_nan_never_relaxed_and_counted_per_side():
    expected = np.array([1.0, np.nan, np.inf], dtype=np.float32)
    actual = np.array([np.nan, np.nan, np.inf], dtype=np.float32)
    diff = compare_tensor(expected, actual, stage="s", tensor="t", ulp=1_000_000)
    assert not diff.passed and diff.failures == 1
    assert diff.ulp["nan_pairs"] == 2
    assert diff.specials["expected"] == {"nan": 1, "inf": 1, "-inf": 0, "-0": 0}
    assert diff.specials["actual"]["nan"] == 2


def test_max_abs_and_rel_error():
    expected = np.array([1.0, 4.0], dtype=np.float32)
    actual = np.array([1.0, 5.0], dtype=np.float32)
    diff = compare_tensor(expected, actual, stage="s", tensor="t")
    assert diff.max_abs_error == 1.0 and diff.max_rel_error == 0.25


def fp8_record(values: np.ndarray) -> np.ndarray:
    scales, codes, _ = quantize_fp8_blocks(values[:448].reshape(7, 64))
    return pack_fp8_record(scales, codes, values[448:])


def test_fp8_record_bytes_are_decoded_by_field():
    values = np.linspace(-2, 2, 512, dtype=np.float32)
    expected = fp8_record(values)[None, None]
    actual = expected.copy()
    actual[0, 0, 65 + 1 + 5] ^= 0x01  # block 1, dim 64 + 5, one code step
    actual[0, 0, 65 * 3] += 1  # block 3 scale byte, one power of two
    actual[0, 0, 455 + 2 * 7] ^= 0x01  # low byte of RoPE tail dim 448 + 7
    diff = compare_tensor(expected, actual, stage="outputs", tensor="present_compressed_kv")
    records = diff.records
    assert records["format"] == "fp8_e4m3_block64"
    assert records["records_differing"] == 1 and records["bytes_differing"] == 3
    code, scale, tail = records["bytes"]
    assert code["field"] == "code" and code["block"] == 1 and code["dim"] == 69
    assert code["code_steps"] == 1 and code["record"] == "b=0 r=0"
    assert scale["field"] == "scale" and scale["block"] == 3 and scale["power_steps"] == 1
    assert scale["actual_value"] == 2 * scale["expected_value"]
    assert tail["field"] == "rope_bf16" and tail["dim"] == 455
    assert tail["expected_value"] == float(bf16_round(values[455]))
    assert tail["actual_value"] != tail["expected_value"]
    assert diff.axes[-1] == "byte"


def test_fp4_record_nibbles_are_decoded_with_their_dims():
    block = np.linspace(-6, 6, 128, dtype=np.float32).reshape(4, 32)
    scales, packed, dequantized = quantize_fp4_blocks(block)
    expected = pack_fp4_record(scales, packed)[None, None]
    actual = expected.copy()
    actual[0, 0, 17 + 3] ^= 0x10  # block 1, byte 3: dims 32 + 4 (low) and 32 + 5 (high)
    diff = compare_tensor(expected, actual, stage="outputs", tensor="present_index_key")
    entry = diff.records["bytes"][0]
    assert diff.records["format"] == "fp4_e2m1_block32"
    assert entry["field"] == "codes" and entry["dims"] == [36, 37]
    assert entry["expected_value"][0] == entry["actual_value"][0]
    assert entry["expected_value"][1] == float(dequantized.reshape(-1)[37])
    assert entry["code_steps"][0] == 0 and entry["code_steps"][1] > 0


def test_integer_rows_list_the_differing_rows():
    expected = np.array([[[0, 3], [1, -1]], [[2, 0], [0, 1]]], dtype=np.int32)
    actual = expected.copy()
    actual[1, 0] = [0, 2]
    diff = compare_tensor(expected, actual, stage="selection", tensor="selected")
    assert diff.rows == {
        "rows_differing": 1,
        "rows": [{"row": "b=1 s=0", "expected": [2, 0], "actual": [0, 2]}],
    }


def test_payloads_report_missing_shape_and_dtype_divergences():
    expected = {
        "outputs": {"Y": np.zeros((1, 1, 1, 4), np.float32), "present_compression_carry": np.zeros(3, np.float32)},
        "selection": {"selected": np.zeros((1, 1, 2), np.int32)},
    }
    actual = {
        "outputs": {"Y": np.zeros((1, 1, 1, 5), np.float32), "extra": np.zeros(2, np.uint8)},
        "selection": {"selected": np.zeros((1, 1, 2), np.int64)},
        "candidate_assembly": {"candidates": np.zeros((1, 1, 3), np.int32)},
    }
    diffs = {(d.stage, d.tensor): d for d in compare_payloads(expected, actual)}
    assert "shape differs" in diffs[("outputs", "Y")].problem
    assert diffs[("outputs", "present_compression_carry")].problem == "missing in actual"
    assert diffs[("outputs", "extra")].problem == "missing in expected"
    assert "dtype differs" in diffs[("selection", "selected")].problem
    assert diffs[("candidate_assembly", "candidates")].problem == "missing in expected"
    assert not any(d.passed for d in diffs.values())


def test_an_array_shared_by_stages_and_outputs_on_both_sides_is_compared_once(monkeypatch):
    """Y is attention's, writeback's and the output's on both sides: one scan, the same diffs as one
    comparison per tensor; a pair that differs, or arrays not shared, are compared each time."""
    import csa_conform.compare.bitwise as diff

    y = np.array([1.0, np.nan, -0.0, np.inf], dtype=np.float32)
    mine, differing = y.copy(), y.copy()
    differing[0] = 2.0
    expected = {"outputs": {"Y": y, "Z": y}, "sparse_sink_softmax_attention": {"Y": y}, "writeback": {"Y": y}}
    actual = {"outputs": {"Y": mine, "Z": differing}, "sparse_sink_softmax_attention": {"Y": mine},
              "writeback": {"Y": mine}}
    scans, original = [], diff.scan
    monkeypatch.setattr(diff, "scan", lambda *arrays: scans.append(len(arrays)) or original(*arrays))
    diffs = compare_payloads(expected, actual)
    assert scans.count(2) == 2  # the pairs' scans: Y once, Z (which differs) once
    each = [compare_tensor(expected[stage][name], actual[stage][name], stage=stage, tensor=name)
            for stage in expected for name in expected[stage]]
    assert [d.to_dict() for d in diffs] == [d.to_dict() for d in each]
    assert [d.passed for d in diffs] == [True, False, True, True]
    diffs[2].specials["expected"]["nan"] = 7
    assert diffs[3].specials["expected"]["nan"] == 1


def test_to_dict_is_strict_json():
    expected = np.array([1.0, np.nan, -np.inf, 0.0], dtype=np.float32)
    actual = np.array([1.5, 2.0, -np.inf, -0.0], dtype=np.float32)
    document = compare_tensor(expected, actual, stage="s", tensor="t").to_dict()
    text = json.dumps(document, allow_nan=False)
    assert json.loads(text)["first"]["coords"] == "a0=0"


@pytest.mark.parametrize(
    ("stage", "tensor", "shape", "dtype", "axes"),
    [
        ("sparse_sink_softmax_attention", "scores", (1, 2, 3, 4), np.float32, ("b", "s", "h", "c")),
        ("index_scoring", "scores", (1, 2, 3), np.float32, ("b", "s", "c")),
        ("outputs", "present_compressed_kv", (1, 2, 583), np.uint8, ("b", "r", "byte")),
        ("outputs", "present_compressed_kv", (1, 2, 512), np.float32, ("b", "r", "d")),
        ("inputs", "attention_bias", (5, 7), np.float32, ("s", "c")),
        ("outputs", "selected_indices", (1, 2, 3, 4), np.int32, ("b", "i", "s", "k")),
        ("stage", "unknown", (2, 2), np.float32, ("a0", "a1")),
    ],
)
def test_default_axes(stage, tensor, shape, dtype, axes):
    assert default_axes(stage, tensor, shape, dtype) == axes


def test_bf16_tail_decode_matches_the_stored_bits():
    values = np.zeros(512, dtype=np.float32)
    values[448] = 1.5
    record = fp8_record(values)
    assert int.from_bytes(bytes(record[455:457]), "little") == int(bf16_bits(np.float32(1.5)))
