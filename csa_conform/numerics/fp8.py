"""E4M3FN codes and the reference's 64-wide FP8 block quantizer.

Encoding takes the sign from the sign bit (-0.0 and negatives that round to
zero give 0x80), saturates at 448 (0x7e), uses 2^-9 subnormal steps and rounds
half to even. The block scale is the E8M0 power ceil(log2f(amax/448)) with
amax floored at 1e-4, so glibc's `log2f` decides the power at boundaries.
"""

from __future__ import annotations

import numpy as np

from csa_conform.numerics.variant import REFERENCE, Numerics
from csa_conform.numerics.blockscale import quantize_blocks
from csa_conform.numerics.e8m0 import e8m0_decode

FP8_BLOCK = 64
E4M3_MAX = np.float32(448.0)
AMAX_FLOOR = np.float32(1.0e-4)
_SUBNORMAL_LIMIT = np.float32(2.0**-6)


def _decode_table() -> np.ndarray:
    codes = np.arange(256)
    exponent = (codes >> 3) & 0x0F
    mantissa = (codes & 0x07).astype(np.float64)
    magnitude = np.where(
        exponent == 0,
        mantissa * 2.0**-9,
        (1.0 + mantissa / 8.0) * np.exp2(exponent - 7.0),
    )
    table = np.where(codes & 0x80, -magnitude, magnitude).astype(np.float32)
    table[[0x7F, 0xFF]] = np.nan
    return table


E4M3_TABLE = _decode_table()


def e4m3_decode(codes) -> np.ndarray:
    return E4M3_TABLE[np.asarray(codes, dtype=np.uint8)]


def e4m3_encode(values, numerics: Numerics = REFERENCE) -> np.ndarray:
    """Codes of binary32 values already clamped to [-448, 448]."""
    values = np.asarray(values, dtype=np.float32)
    sign = ((values.view(np.uint32) >> np.uint32(24)) & np.uint32(0x80)).astype(np.uint8)
    magnitude = np.abs(values)
    bits = magnitude.view(np.uint32).astype(np.int64)
    if numerics.code_ties_away:  # a variant's convention: midpoints to the larger magnitude
        subnormal = np.floor(magnitude.astype(np.float64) * 512.0 + 0.5).astype(np.int64)
        normal = ((bits + 0x80000) >> 20) - (120 << 3)
    else:
        subnormal = np.rint(magnitude * np.float32(512.0)).astype(np.int64)
        normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) >> 20) - (120 << 3)
    if numerics.codes_truncated:  # a variant's convention: the mantissa's dropped bits cut off
        normal = (bits >> 20) - (120 << 3)
    code = np.where(magnitude < _SUBNORMAL_LIMIT, subnormal, normal)
    return sign | code.astype(np.uint8)


def quantize_fp8_blocks(x, numerics: Numerics = REFERENCE):
    """FP8 E4M3 block-64 quantization of x[..., 64].

    Returns (scale_bytes u8[...], codes u8[..., 64], dequantized f32[..., 64]).
    """
    return quantize_blocks(x, E4M3_MAX, AMAX_FLOOR, e4m3_encode, e4m3_decode, "FP8 E4M3", numerics)


def dequantize_fp8_blocks(scale_bytes, codes) -> np.ndarray:
    return e4m3_decode(codes) * e8m0_decode(scale_bytes)[..., None]
