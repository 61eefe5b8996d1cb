"""bfloat16 rounding exactly as the reference's `half` crate does it.

Round-to-nearest-even on the binary32 bit pattern; a NaN keeps its sign and
top mantissa bits and gets the quiet bit, so it never rounds into infinity.
A numerics variant may name another convention (ties away from zero,
truncation), which is how explain recognises a kernel that rounds so.
"""

from __future__ import annotations

import numpy as np

from csa_conform.numerics.variant import REFERENCE, Numerics

# convention -> what is added to the binary32 pattern before the top 16 bits are kept
CONVENTIONS = {"ties-away": 0x8000, "truncate": 0}


def bf16_bits(x, numerics: Numerics = REFERENCE) -> np.ndarray:
    """bfloat16 bit patterns (uint16) of binary32 values."""
    return _rounded_upper_halves(x, numerics).astype(np.uint16)


def _rounded_upper_halves(x, numerics: Numerics) -> np.ndarray:
    """The bfloat16 patterns as uint32 (the upper half of each binary32 after rounding), in place
    where it can be: rounding draws of a hundred million values is most of what making a prod case costs."""
    numerics.record("bf16 input", x)
    values = np.asarray(x, dtype=np.float32)
    bits = values.view(np.uint32)
    rounded = np.right_shift(bits, np.uint32(16), out=np.empty_like(bits))
    rounded &= np.uint32(1)  # ties go to the even upper half: add 0x7fff, or 0x8000 when it is odd
    rounded += bits
    rounded += np.uint32(0x7FFF)
    rounded >>= np.uint32(16)
    convention = numerics.bf16_rounding
    if convention is not None:
        swapped = (bits.astype(np.uint64) + np.uint64(CONVENTIONS[convention])) >> np.uint64(16)
        numerics.count_bf16(rounded, swapped.astype(np.uint32))
        rounded = swapped.astype(np.uint32)
    is_nan = np.isnan(values)
    if is_nan.any():
        rounded[is_nan] = (bits[is_nan] >> np.uint32(16)) | np.uint32(0x40)
    return rounded


def bf16_to_f32(bits) -> np.ndarray:
    """Widen bfloat16 bit patterns to binary32 (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def bf16_round(x, numerics: Numerics = REFERENCE) -> np.ndarray:
    """binary32 values rounded through bfloat16 and back."""
    rounded = _rounded_upper_halves(x, numerics)
    rounded <<= np.uint32(16)
    widened = rounded.view(np.float32)
    return widened if widened.ndim else widened[()]
