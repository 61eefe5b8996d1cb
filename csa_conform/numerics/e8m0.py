"""E8M0 block-scale bytes: a bare biased exponent, 2^(e-127).

Byte 0 decodes to 2^-127, which binary32 holds only as the subnormal
0x00400000; byte 0xff is not a scale and decodes to NaN.
"""

from __future__ import annotations

import numpy as np

BIAS = 127
MIN_BYTE = 1
MAX_BYTE = 254


def _decode_table() -> np.ndarray:
    table = np.zeros(256, dtype=np.float32)
    exponents = np.arange(1, 255, dtype=np.uint32)
    table[1:255] = (exponents << np.uint32(23)).view(np.float32)
    table[0] = np.uint32(0x00400000).view(np.float32)
    table[255] = np.float32(np.nan)
    return table


E8M0_TABLE = _decode_table()


def e8m0_decode(scale_bytes) -> np.ndarray:
    return E8M0_TABLE[np.asarray(scale_bytes, dtype=np.uint8)]


def e8m0_encode(power) -> np.ndarray:
    """Scale byte of an integer power of two; the reference's powers stay in 1..254 once biased."""
    biased = np.asarray(power, dtype=np.int64) + BIAS
    if ((biased < MIN_BYTE) | (biased > MAX_BYTE)).any():
        raise ValueError("E8M0 scale power outside the encodable range -126..127")
    return biased.astype(np.uint8)


def power_of_two(power) -> np.ndarray:
    """2^power as binary32 for integer powers in the normal range (what `powi` gives)."""
    power = np.asarray(power, dtype=np.int64)
    return ((power + BIAS).astype(np.uint32) << np.uint32(23)).view(np.float32)
