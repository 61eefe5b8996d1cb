"""The special values of a float tensor (NaN, +inf, -inf, -0) and its bit equality to another, in one pass.

verify compares every stored tensor with the oracle's and reports its
special values; done with NumPy's predicates that was five passes over each
tensor (isnan twice, isposinf, isneginf, the -0 test) after the equality
pass. Here one pass over the two bit patterns answers all of it. Values are
classified by bits, as the predicates classify them: a NaN is any exponent
of all ones with a non-zero fraction (every payload, either sign, quiet or
signalling), an infinity the exponent of all ones with a zero fraction, -0
the sign bit alone (a negative subnormal is not -0).

The numba kernel runs where numba can be loaded (the oracle engine's rule:
importable, and room under ``ulimit -v``); the NumPy formulation is the
fallback, a few passes that skip the NaN and infinity counts when the
largest magnitude shows there are none. Both give the same counts
(tests/diff/test_specials.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

__all__ = ["Scan", "scan", "scan_engine"]

_UINT_OF_SIZE = {2: np.uint16, 4: np.uint32, 8: np.uint64}


@dataclass(frozen=True)
class Scan:
    """``equal``: the two bit patterns are the same; the counts are of the first tensor."""

    equal: bool
    nan: int
    inf: int
    negative_inf: int
    negative_zero: int

    def specials(self) -> dict:
        """The counts as a TensorDiff reports them."""
        return {"nan": self.nan, "inf": self.inf, "-inf": self.negative_inf, "-0": self.negative_zero}


def scan(expected: np.ndarray, actual: np.ndarray | None = None, engine: str | None = None) -> Scan:
    """One pass over two float tensors of one dtype and shape (``actual`` None: ``expected`` alone)."""
    expected = np.ascontiguousarray(expected)
    if expected.dtype.kind != "f" or expected.dtype.itemsize not in _UINT_OF_SIZE:
        raise TypeError(f"scan needs a float tensor of 2, 4 or 8 bytes, not {expected.dtype}")
    unsigned = _UINT_OF_SIZE[expected.dtype.itemsize]
    bits = expected.reshape(-1).view(unsigned)
    other = bits if actual is None else np.ascontiguousarray(actual).reshape(-1).view(unsigned)
    infinity = np.array(np.inf, dtype=expected.dtype).view(unsigned)[()]
    sign = unsigned(1) << unsigned(8 * expected.dtype.itemsize - 1)
    magnitude = sign - unsigned(1)
    if (engine or scan_engine()) == "numba":
        from csa_conform.oracle.compiled.special_kernels import special_values

        equal, *counts = special_values(bits, other, infinity, sign, magnitude)
        return Scan(bool(equal), *(int(count) for count in counts))
    return _numpy_scan(bits, other, infinity, sign, magnitude)


@cache
def scan_engine() -> str:
    """numba where the oracle's auto engine would load it, else numpy."""
    from csa_conform.oracle.engine import auto_engine_name

    return auto_engine_name()


def _numpy_scan(bits: np.ndarray, other: np.ndarray, infinity, sign, magnitude_mask) -> Scan:
    equal = other is bits or bool(np.array_equal(bits, other))
    negative_zero = int(np.count_nonzero(bits == sign))
    if not bits.size:
        return Scan(equal, 0, 0, 0, negative_zero)
    magnitude = bits & magnitude_mask
    if magnitude.max() < infinity:
        return Scan(equal, 0, 0, 0, negative_zero)
    return Scan(
        equal,
        int(np.count_nonzero(magnitude > infinity)),
        int(np.count_nonzero(bits == infinity)),
        int(np.count_nonzero(bits == (infinity | sign))),
        negative_zero,
    )
