"""bf16, E4M3FN, E2M1 and E8M0 against the reference's own tables and against ml_dtypes."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_corpus import reference_file

from csa_conform.numerics import (
    bf16_bits,
    bf16_round,
    e2m1_decode,
    e2m1_encode,
    e4m3_decode,
    e4m3_encode,
    e8m0_decode,
)
from csa_conform.numerics.fp4 import E2M1_TABLE
from csa_conform.numerics.fp8 import E4M3_TABLE

RNG = np.random.default_rng(20261129)


def bits(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).view(np.uint32)


def random_f32(count: int) -> np.ndarray:
    return RNG.integers(0, 2**32, count, dtype=np.uint64).astype(np.uint32).view(np.float32)


def test_bf16_matches_reference_bits_and_round_trip():
    archive = reference_file("prim_bf16.npz")
    assert np.array_equal(bf16_bits(archive["in/values"]), archive["out/bits"])
    assert np.array_equal(bits(bf16_round(archive["in/values"])), bits(archive["out/roundtrip"]))


def test_bf16_equals_ml_dtypes_except_nan_payloads():
    values = random_f32(1_000_000)
    ours = bf16_bits(values)
    with np.errstate(invalid="ignore"):
        theirs = values.astype(ml_dtypes.bfloat16).view(np.uint16)
    finite = ~np.isnan(values)
    assert np.array_equal(ours[finite], theirs[finite])
    assert np.all((ours[~finite] & 0x7FC0) == 0x7FC0), "NaN keeps the quiet bit set"
    assert np.array_equal(ours[~finite] >> 15, (bits(values[~finite]) >> 31).astype(np.uint16))


def test_bf16_nan_keeps_sign_and_top_mantissa_bits_with_quiet_bit():
    signalling = np.array([0x7F800001, 0xFF812345, 0x7FBFFFFF], dtype=np.uint32).view(np.float32)
    assert bf16_bits(signalling).tolist() == [0x7FC0, 0xFFC1, 0x7FFF]


def test_decode_tables_match_reference():
    archive = reference_file("prim_decode_tables.npz")
    for ours, name in ((E4M3_TABLE, "decode_e4m3"), (E2M1_TABLE, "decode_e2m1")):
        assert np.array_equal(bits(ours), bits(archive["out/" + name]), name)
    decoded = e8m0_decode(np.arange(256, dtype=np.uint8))
    expected = archive["out/decode_e8m0"]
    assert np.array_equal(np.isnan(decoded), np.isnan(expected))
    assert np.array_equal(bits(decoded[:255]), bits(expected[:255]))
    assert bits(decoded[0]) == 0x00400000


def test_e8m0_decode_equals_ml_dtypes():
    codes = np.arange(255, dtype=np.uint8)
    assert np.array_equal(bits(e8m0_decode(codes)), bits(codes.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)))


def test_e4m3_encode_equals_ml_dtypes_on_clamped_values():
    """The reference rule (sign bit, RNE, 2^-9 subnormals) is ml_dtypes' cast once inputs are clamped to ±448."""
    values = np.clip(random_f32(2_000_000), -448, 448)
    values = values[~np.isnan(values)]
    scaled = np.clip(RNG.standard_normal(1_000_000).astype(np.float32) * np.float32(64), -448, 448)
    grid = E4M3_TABLE[np.isfinite(E4M3_TABLE)]
    midpoints = (grid[:-1].astype(np.float64) + np.diff(grid.astype(np.float64)) / 2).astype(np.float32)
    for sample in (values, scaled, midpoints, np.nextafter(midpoints, np.float32(0))):
        expected = sample.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
        assert np.array_equal(e4m3_encode(sample), expected)


def test_e4m3_signed_zero_and_saturation():
    assert e4m3_encode(np.float32([-0.0, -1e-30, 0.0, 448.0, -448.0])).tolist() == [0x80, 0x80, 0x00, 0x7E, 0xFE]


def test_e4m3_round_trip_is_exact_on_every_code():
    codes = np.array([c for c in range(256) if c not in (0x7F, 0xFF)], dtype=np.uint8)
    assert np.array_equal(e4m3_encode(e4m3_decode(codes)), codes)


def test_e2m1_never_emits_negative_zero_where_ml_dtypes_does():
    values = np.clip(RNG.standard_normal(1_000_000).astype(np.float32) * np.float32(3), -6, 6)
    values = np.concatenate([values, np.float32([-0.0, -0.25, -1e-20, -0.2499, 0.25, 0.75, -0.75])])
    ours = e2m1_encode(values)
    theirs = values.astype(ml_dtypes.float4_e2m1fn).view(np.uint8)
    differs = ours != theirs
    assert differs.any(), "the documented difference must be exercised"
    assert np.all(theirs[differs] == 8) and np.all(ours[differs] == 0)
    assert not (ours == 8).any()


def test_e2m1_ties_go_to_the_even_code():
    midpoints = np.float32([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.75, -1.75])
    assert e2m1_encode(midpoints).tolist() == [0, 2, 2, 4, 4, 6, 6, 10, 12]


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=-6, max_value=6, width=32))
def test_e2m1_encode_is_a_nearest_table_value(value):
    code = int(e2m1_encode(np.float32(value)))
    distance = abs(np.float64(value) - np.float64(e2m1_decode(code)))
    assert distance <= np.abs(np.float64(value) - E2M1_TABLE.astype(np.float64)).min()


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=-448, max_value=448, width=32))
def test_e4m3_encode_is_a_nearest_code_with_the_input_sign(value):
    code = int(e4m3_encode(np.float32(value)))
    assert code not in (0x7F, 0xFF)
    assert (code >> 7) == int(np.signbit(np.float32(value)))
    finite = E4M3_TABLE[np.isfinite(E4M3_TABLE)].astype(np.float64)
    assert abs(np.float64(value) - np.float64(e4m3_decode(code))) == pytest.approx(
        np.abs(np.float64(value) - finite).min(), abs=0
    )
