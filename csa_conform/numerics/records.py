"""Byte layouts of the persistent compressed records.

Hybrid FP8/BF16 attention record (583 bytes): 7 x [E8M0 scale, 64 E4M3 codes]
for dims 0..447, then the 64-dim RoPE tail as little-endian bfloat16.
FP4 index record (68 bytes): 4 x [E8M0 scale, 16 bytes of nibble pairs].
"""

from __future__ import annotations

import numpy as np

from csa_conform.numerics.bf16 import bf16_bits, bf16_to_f32
from csa_conform.numerics.fp4 import FP4_BLOCK, dequantize_fp4_blocks
from csa_conform.numerics.fp8 import FP8_BLOCK, dequantize_fp8_blocks
from csa_conform.numerics.variant import REFERENCE, Numerics

HEAD_DIM = 512
ROPE_DIM = 64
FP8_BLOCKS = (HEAD_DIM - ROPE_DIM) // FP8_BLOCK
FP8_BLOCK_BYTES = FP8_BLOCK + 1
FP8_SCALED_BYTES = FP8_BLOCKS * FP8_BLOCK_BYTES  # the scaled blocks before the bf16 tail
FP8_RECORD_BYTES = FP8_SCALED_BYTES + ROPE_DIM * 2
INDEX_DIM = 128
FP4_BLOCKS = INDEX_DIM // FP4_BLOCK
FP4_BLOCK_BYTES = FP4_BLOCK // 2 + 1
FP4_RECORD_BYTES = FP4_BLOCKS * FP4_BLOCK_BYTES


def pack_fp8_record(scale_bytes, codes, tail, numerics: Numerics = REFERENCE) -> np.ndarray:
    """u8[..., 583] from scales[..., 7], codes[..., 7, 64] and the f32 RoPE tail[..., 64]."""
    scale_bytes = np.asarray(scale_bytes, dtype=np.uint8)
    blocks = np.concatenate([scale_bytes[..., None], np.asarray(codes, dtype=np.uint8)], axis=-1)
    tail_bytes = bf16_bits(tail, numerics).astype("<u2").view(np.uint8)
    lead = blocks.shape[:-2]
    head = blocks.reshape(lead + (FP8_BLOCKS * (FP8_BLOCK + 1),))
    return np.concatenate([head, tail_bytes.reshape(lead + (ROPE_DIM * 2,))], axis=-1)


def unpack_fp8_record(records):
    """(scales u8[..., 7], codes u8[..., 7, 64], tail bf16 bits u16[..., 64])."""
    records = np.asarray(records, dtype=np.uint8)
    lead = records.shape[:-1]
    fp8_bytes = FP8_BLOCKS * (FP8_BLOCK + 1)
    blocks = records[..., :fp8_bytes].reshape(lead + (FP8_BLOCKS, FP8_BLOCK + 1))
    tail = np.ascontiguousarray(records[..., fp8_bytes:]).view("<u2").astype(np.uint16)
    return blocks[..., 0], blocks[..., 1:], tail


def decode_fp8_record(records) -> np.ndarray:
    """The logical f32[..., 512] record attention reads."""
    scales, codes, tail = unpack_fp8_record(records)
    head = dequantize_fp8_blocks(scales, codes).reshape(scales.shape[:-1] + (HEAD_DIM - ROPE_DIM,))
    return np.concatenate([head, bf16_to_f32(tail)], axis=-1)


def pack_fp4_record(scale_bytes, packed) -> np.ndarray:
    """u8[..., 68] from scales[..., 4] and nibble bytes[..., 4, 16]."""
    scale_bytes = np.asarray(scale_bytes, dtype=np.uint8)
    blocks = np.concatenate([scale_bytes[..., None], np.asarray(packed, dtype=np.uint8)], axis=-1)
    return blocks.reshape(blocks.shape[:-2] + (FP4_RECORD_BYTES,))


def unpack_fp4_record(records):
    """(scales u8[..., 4], nibble bytes u8[..., 4, 16])."""
    records = np.asarray(records, dtype=np.uint8)
    blocks = records.reshape(records.shape[:-1] + (FP4_BLOCKS, FP4_BLOCK // 2 + 1))
    return blocks[..., 0], blocks[..., 1:]


def decode_fp4_record(records) -> np.ndarray:
    """The logical f32[..., 128] index key scoring reads."""
    scales, packed = unpack_fp4_record(records)
    values = dequantize_fp4_blocks(scales, packed)
    return values.reshape(values.shape[:-2] + (INDEX_DIM,))
