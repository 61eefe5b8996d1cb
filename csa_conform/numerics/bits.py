"""Bit patterns as integers: the one definition of "equal bits" and of ULP distance.

Bit-exact means the same bit pattern, so every comparison in the package reads
an array through its unsigned integer view (-0 is not +0, a NaN equals only
its own payload) instead of comparing values.
"""

from __future__ import annotations

import numpy as np

UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
SIGNED = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}


def unsigned(array) -> np.ndarray:
    """The array's bit patterns as unsigned integers of its width (C order; a bool array as uint8)."""
    array = np.asarray(array, order="C")
    return array.view(np.uint8 if array.dtype.kind == "b" else UNSIGNED[array.dtype.itemsize])


def same_bits(left, right) -> bool:
    """Same dtype, same shape and the same bit pattern in every element."""
    left, right = np.asarray(left), np.asarray(right)
    return (left.dtype == right.dtype and left.shape == right.shape
            and np.ascontiguousarray(left).tobytes() == np.ascontiguousarray(right).tobytes())


def equal_bits(left, right) -> np.ndarray:
    """Per element: whether two arrays of one width hold the same bit pattern."""
    return unsigned(left) == unsigned(right)


def differing_bits(left, right) -> np.ndarray:
    """Per element: whether two arrays of one width hold different bit patterns."""
    return unsigned(left) != unsigned(right)


def ordered(bits: np.ndarray) -> np.ndarray:
    """Float bit patterns mapped onto int64 in numeric order, -0 just below +0.

    This is the total order of Rust's ``total_cmp``: the distance between two
    floats is the number of representable values between them, so +0 and -0
    are one ULP apart and bit equality is exactly distance zero.
    """
    signed = bits.view(SIGNED[bits.dtype.itemsize]).astype(np.int64)
    magnitude = (1 << (8 * bits.dtype.itemsize - 1)) - 1
    return np.where(signed < 0, -(signed & magnitude) - 1, signed)


def ulp_distance(expected_bits: np.ndarray, actual_bits: np.ndarray) -> np.ndarray:
    """How many representable values lie between two float bit patterns, element by element."""
    return np.abs(ordered(expected_bits) - ordered(actual_bits))
