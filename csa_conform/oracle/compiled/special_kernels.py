"""The numba kernel of csa_conform.compare.specials: bit equality and special-value counts in one pass."""

from __future__ import annotations

from numba import njit

from csa_conform.oracle.compiled.cache import kernel_cache


@njit(cache=kernel_cache(), nogil=True)
def special_values(bits, other, infinity, sign, magnitude_mask):
    """(bits == other everywhere, NaNs, +infs, -infs, -0s of bits): unsigned patterns of one float width."""
    negative_infinity = infinity | sign
    differ = 0
    nan = 0
    positive = 0
    negative = 0
    zero = 0
    for index in range(bits.size):
        value = bits[index]
        differ += value != other[index]
        nan += (value & magnitude_mask) > infinity
        positive += value == infinity
        negative += value == negative_infinity
        zero += value == sign
    return differ == 0, nan, positive, negative, zero
