"""FP8/FP4 block quantizers, record layouts, Hadamard and RoPE."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from reference_corpus import reference_file

from csa_conform import ContractError
from csa_conform.numerics import (
    bf16_bits,
    bf16_round,
    compressed_rope,
    decode_fp4_record,
    decode_fp8_record,
    e8m0_decode,
    finalize_index_query,
    hadamard_bf16,
    pack_fp4_record,
    pack_fp8_record,
    quantize_fp4_blocks,
    quantize_fp8_blocks,
    unpack_fp4_record,
    unpack_fp8_record,
)
from csa_conform.numerics.fp4 import unpack_nibbles

RNG = np.random.default_rng(7)
bf16_like = st.floats(min_value=-1e4, max_value=1e4, width=32)


def bits(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).view(np.uint32)


def test_fp4_blocks_match_reference_including_rejections():
    archive = reference_file("prim_fp4block.npz")
    errors = json.loads(str(archive["errors_json"]))
    for index, block in enumerate(archive["in/blocks"]):
        if not archive["out/ok"][index]:
            with pytest.raises(ContractError) as raised:
                quantize_fp4_blocks(block)
            assert "kernel execution failed: " + str(raised.value) == errors[str(index)]
            continue
        scale, packed, dequantized = quantize_fp4_blocks(block)
        assert scale == archive["out/scale_e8m0"][index]
        assert np.array_equal(packed, archive["out/codes"][index])
        assert np.array_equal(bits(dequantized), bits(archive["out/dequantized"][index]))


def test_batched_quantization_equals_block_by_block():
    blocks = RNG.standard_normal((5, 7, 64)).astype(np.float32) * np.float32(3)
    scales, codes, dequantized = quantize_fp8_blocks(blocks)
    for index in np.ndindex(blocks.shape[:-1]):
        one = quantize_fp8_blocks(blocks[index])
        assert one[0] == scales[index] and np.array_equal(one[1], codes[index])
        assert np.array_equal(bits(one[2]), bits(dequantized[index]))


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.float32, 64, elements=bf16_like))
def test_fp8_block_round_trip_bound_and_encodings(block):
    scale_byte, codes, dequantized = quantize_fp8_blocks(block)
    scale = e8m0_decode(scale_byte)
    assert 1 <= scale_byte <= 254
    assert not np.isin(codes, [0x7F, 0xFF]).any()
    assert np.all(np.abs(dequantized.astype(np.float64) - block) <= 16 * np.float64(scale))
    assert np.all((codes >> 7) == np.signbit(block))


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.float32, 32, elements=bf16_like))
def test_fp4_block_round_trip_bound_and_no_negative_zero(block):
    scale_byte, packed, dequantized = quantize_fp4_blocks(block)
    scale = e8m0_decode(scale_byte)
    assert 1 <= scale_byte <= 254
    assert not (unpack_nibbles(packed) == 8).any()
    assert np.all(np.abs(dequantized.astype(np.float64) - block) <= np.float64(scale))


def test_fp8_scale_on_a_power_of_two_boundary_is_exact():
    block = np.zeros(64, dtype=np.float32)
    block[3] = 448.0 * 2.0**-5
    scale_byte, codes, dequantized = quantize_fp8_blocks(block)
    assert scale_byte == 127 - 5 and codes[3] == 0x7E and dequantized[3] == block[3]


def test_fp8_amax_floor_sets_the_smallest_scale():
    scale_byte, codes, _ = quantize_fp8_blocks(np.zeros(64, dtype=np.float32))
    assert scale_byte == 127 - 22 and not codes.any()


def test_quantizer_names_the_first_failing_block():
    blocks = np.ones((3, 64), dtype=np.float32)
    blocks[1, 5] = np.inf
    blocks[2, 0] = 3.4e38
    with pytest.raises(ContractError, match="^block dequantization: FP8 E4M3 input contains a non-finite value$"):
        quantize_fp8_blocks(blocks)
    blocks[1, 5] = 1.0
    with pytest.raises(ContractError) as raised:
        quantize_fp8_blocks(blocks)
    assert str(raised.value) == (
        "block dequantization: FP8 E4M3 value 256 overflows with block scale "
        "1329228000000000000000000000000000000"
    )


def test_fp4_compressed_cache_quantizes_nontrivial_values_with_e2m1_bound():
    d = np.arange(32)
    observed_error = False
    for record in range(2):
        magnitude = np.float32(0.3) + ((d * 7 + record * 5) % 24).astype(np.float32) * np.float32(0.23)
        source = np.where((d + record) % 3 == 0, -magnitude, magnitude).astype(np.float32)
        scale_byte, packed, dequantized = quantize_fp4_blocks(source)
        scale = e8m0_decode(scale_byte)
        error = np.abs(dequantized - source)
        assert np.all(error <= scale)
        observed_error |= bool((error > 0).any())
        record_bytes = pack_fp4_record(np.repeat(scale_byte, 4), np.tile(packed, (4, 1)))
        assert np.array_equal(bits(decode_fp4_record(record_bytes)), bits(np.tile(dequantized, 4)))
    assert observed_error


def test_fp8_hybrid_d512_preserves_bf16_rope_tail():
    record = bf16_round(RNG.standard_normal(512).astype(np.float32))
    scales, codes, dequantized = quantize_fp8_blocks(record[:448].reshape(7, 64))
    packed = pack_fp8_record(scales, codes, record[448:])
    assert packed.shape == (583,)
    logical = decode_fp8_record(packed)
    assert np.array_equal(bits(logical[448:]), bits(record[448:]))
    assert np.array_equal(bits(logical[:448]), bits(dequantized.reshape(448)))
    assert np.array_equal(packed[455:].view("<u2"), bf16_bits(record[448:]))
    unpacked_scales, unpacked_codes, tail = unpack_fp8_record(packed)
    assert np.array_equal(unpacked_scales, scales) and np.array_equal(unpacked_codes, codes)
    assert np.array_equal(tail, bf16_bits(record[448:]))


def test_fp4_record_round_trip():
    scales = RNG.integers(100, 140, (3, 4)).astype(np.uint8)
    nibbles = RNG.integers(0, 256, (3, 4, 16)).astype(np.uint8)
    packed = pack_fp4_record(scales, nibbles)
    assert packed.shape == (3, 68)
    got_scales, got_nibbles = unpack_fp4_record(packed)
    assert np.array_equal(got_scales, scales) and np.array_equal(got_nibbles, nibbles)


def scalar_hadamard(values: np.ndarray) -> np.ndarray:
    """Element-by-element butterfly: an independent spelling of the reference loop."""
    out = [np.float32(v) for v in values]
    span = 1
    while span < len(out):
        for start in range(0, len(out), 2 * span):
            for offset in range(span):
                a, b = out[start + offset], out[start + offset + span]
                out[start + offset], out[start + offset + span] = np.float32(a + b), np.float32(a - b)
        span *= 2
    scale = np.float32(1) / np.sqrt(np.float32(len(out)))
    return bf16_round(np.array([np.float32(v * scale) for v in out], dtype=np.float32))


@pytest.mark.parametrize("width", [1, 2, 8, 128])
def test_hadamard_matches_scalar_butterfly(width):
    values = RNG.standard_normal((3, width)).astype(np.float32) * np.float32(10)
    expected = np.stack([scalar_hadamard(row) for row in values])
    assert np.array_equal(bits(hadamard_bf16(values)), bits(expected))


def test_hadamard_rejects_width_that_is_not_a_power_of_two():
    with pytest.raises(ContractError) as raised:
        hadamard_bf16(np.zeros(96, dtype=np.float32))
    assert str(raised.value) == (
        "CompressedSparseAttention: Unsupported: Hadamard index width must be a power of two, got 96"
    )
    assert raised.value.kind == "unsupported"


def test_rope_at_position_zero_only_rounds_through_bf16():
    tail = RNG.standard_normal((4, 64)).astype(np.float32)
    assert np.array_equal(bits(compressed_rope(tail, 0)), bits(bf16_round(tail)))


def test_rope_rejects_odd_width():
    with pytest.raises(ContractError, match="compressed RoPE tail width must be even"):
        compressed_rope(np.zeros(63, dtype=np.float32), 5)


def test_rope_positions_broadcast_over_leading_shape():
    tail = RNG.standard_normal((2, 3, 64)).astype(np.float32)
    positions = np.array([[0, 100, 70000]])
    batched = compressed_rope(tail, positions)
    for b, s in np.ndindex(2, 3):
        assert np.array_equal(bits(batched[b, s]), bits(compressed_rope(tail[b, s], positions[0, s])))


def test_finalize_index_query_rows_are_independent():
    queries = RNG.standard_normal((2, 5, 3, 128)).astype(np.float32)
    positions = np.arange(5)[None, :, None] + 1000
    batched = finalize_index_query(queries, 64, positions)
    for b, s, h in np.ndindex(2, 5, 3):
        one = finalize_index_query(queries[b, s, h], 64, 1000 + s)
        assert np.array_equal(bits(batched[b, s, h]), bits(one))
