"""E2M1 codes and the reference's 32-wide FP4 block quantizer.

The reference encodes by "nearest of the 16 table values, ties to the even
code, first match wins", so it never emits code 8 (-0): -0.0 and negatives
that round to zero encode as code 0. A plain float4 cast (ml_dtypes) gives 8.
The scale power is ceil(log2f(amax/6)) with amax floored at 6*2^-126.
"""

from __future__ import annotations

import numpy as np

from csa_conform.numerics.variant import REFERENCE, Numerics
from csa_conform.numerics.e8m0 import e8m0_decode
from csa_conform.numerics.blockscale import quantize_blocks

FP4_BLOCK = 32
E2M1_MAX = np.float32(6.0)
AMAX_FLOOR = np.float32(6.0 * 2.0**-126)

E2M1_TABLE = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    dtype=np.float32,
)

# (threshold, inclusive): magnitude code k+1 starts at the k-th midpoint; a
# midpoint belongs to whichever neighbour has the even code.
_MIDPOINTS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def e2m1_decode(codes) -> np.ndarray:
    return E2M1_TABLE[np.asarray(codes, dtype=np.uint8) & np.uint8(0x0F)]


def e2m1_encode(values, numerics: Numerics = REFERENCE) -> np.ndarray:
    """Codes of binary32 values already clamped to [-6, 6]."""
    values = np.asarray(values, dtype=np.float32)
    magnitude = np.abs(values)
    code = np.zeros(values.shape, dtype=np.uint8)
    away = numerics.code_ties_away  # a variant's convention: every midpoint to the larger magnitude
    for threshold, inclusive in _MIDPOINTS:
        above = magnitude >= threshold if inclusive or away else magnitude > threshold
        code += above.astype(np.uint8)
    negative = np.signbit(values) & (code != 0)
    return code | (negative.astype(np.uint8) << np.uint8(3))


def pack_nibbles(codes) -> np.ndarray:
    """Two codes a byte, the lower-indexed one in the low nibble."""
    codes = np.asarray(codes, dtype=np.uint8)
    return codes[..., 0::2] | (codes[..., 1::2] << np.uint8(4))


def unpack_nibbles(packed) -> np.ndarray:
    packed = np.asarray(packed, dtype=np.uint8)
    codes = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), dtype=np.uint8)
    codes[..., 0::2] = packed & np.uint8(0x0F)
    codes[..., 1::2] = packed >> np.uint8(4)
    return codes


def quantize_fp4_blocks(x, numerics: Numerics = REFERENCE):
    """FP4 E2M1 block-32 quantization of x[..., 32].

    Returns (scale_bytes u8[...], packed u8[..., 16], dequantized f32[..., 32]).
    """
    scales, codes, dequantized = quantize_blocks(x, E2M1_MAX, AMAX_FLOOR, e2m1_encode, e2m1_decode, "FP4 E2M1",
                                                 numerics)
    return scales, pack_nibbles(codes), dequantized


def dequantize_fp4_blocks(scale_bytes, packed) -> np.ndarray:
    return e2m1_decode(unpack_nibbles(packed)) * e8m0_decode(scale_bytes)[..., None]
