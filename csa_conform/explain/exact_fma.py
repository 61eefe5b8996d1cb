"""Binary32 fma(a, b, c) with one rounding, compiled: what explain's FMA hypotheses evaluate.

The formulation is csa_conform.numerics.variant.fmaf's, proven exact: a
binary32 product has at most 48 significant bits and exponents in
[-298, 256], so it is exact in binary64; Knuth's TwoSum gives the binary64
sum and its exact error; rounding that sum to odd (set the last bit when the
error is non-zero) keeps 53 >= 24 + 2 bits, so the single rounding to
binary32 that follows is the correct rounding of a*b + c (Boldo & Melquiond,
"Emulation of FMA and correctly rounded sums: proved algorithms using
rounding to odd"). Infinities and NaNs pass through the binary64 arithmetic
as IEEE says. With numba the loop is compiled (fastmath off, so nothing is
contracted); without it the NumPy formulation runs. Both are compared with
the C library's fmaf on every edge class in tests/explain/test_exact_fma.py.
An accumulation dot product's FMA hypothesis runs once per reduction index
over the whole output: ``fused_accumulate`` does it in place in one compiled
pass (no temporaries, broadcast operands read where they lie), counting the
results the fusion changed, which the tally reports. Attention's logit dots
and value sums are outer products summed over a reduction axis of a few
hundred tiny rows: ``outer_accumulate`` sums them whole in one compiled call,
fused or rounded twice as the reference does, where a call per reduction
index would be nearly all overhead (``Numerics.outer_sum``); ``wide_accumulate``
sums the value sum of a port that carries it in binary64.
"""

from __future__ import annotations

from functools import cache
from typing import Callable

import numpy as np

from csa_conform.numerics.variant import fmaf as numpy_fmaf
from csa_conform.numerics.variant import fused_accumulate as numpy_fused_accumulate
from csa_conform.oracle.engine import numba_available

__all__ = ["fmaf", "fused_accumulate", "outer_accumulate", "wide_accumulate"]


@cache
def _kernel() -> Callable:
    """The compiled loop over flat binary32 arrays (compiled on first use)."""
    from numba import njit

    from csa_conform.oracle.compiled.cache import kernel_cache

    @njit(cache=kernel_cache(), fastmath=False)
    def fused(a, b, c, out):  # pragma: no cover - compiled
        totals = np.empty(a.shape[0], dtype=np.float64)
        bits = totals.view(np.int64)
        for i in range(a.shape[0]):
            product = np.float64(a[i]) * np.float64(b[i])
            addend = np.float64(c[i])
            total = product + addend
            totals[i] = total
            if total - total != 0.0:  # an infinity or a NaN: IEEE's result already
                out[i] = np.float32(total)
                continue
            virtual = total - product
            error = (product - (total - virtual)) + (addend - virtual)
            if error != 0.0 and (bits[i] & 1) == 0:
                bits[i] += 1 if (error > 0.0) == (total > 0.0) else -1
            out[i] = np.float32(totals[i])
    return fused


@cache
def _accumulator() -> Callable:
    """The compiled in-place accumulation over arrays of any layout, broadcast views included (compiled on
    first use): fused()'s arithmetic per element, and a count of results unlike the two roundings'."""
    from numba import njit

    from csa_conform.oracle.compiled.cache import kernel_cache

    @njit(cache=kernel_cache(), fastmath=False)
    def accumulate(acc, a, b):  # pragma: no cover - compiled
        results = np.empty(2, dtype=np.float32)
        bits = results.view(np.uint32)
        total = np.empty(1, dtype=np.float64)
        total_bits = total.view(np.int64)
        changed = 0
        for index in np.ndindex(acc.shape):
            x, y, c = a[index], b[index], acc[index]
            product = np.float64(x) * np.float64(y)
            addend = np.float64(c)
            total[0] = product + addend
            if total[0] - total[0] == 0.0:  # finite: rounded to odd (an infinity or a NaN is IEEE's already)
                virtual = total[0] - product
                error = (product - (total[0] - virtual)) + (addend - virtual)
                if error != 0.0 and (total_bits[0] & 1) == 0:
                    total_bits[0] += 1 if (error > 0.0) == (total[0] > 0.0) else -1
            results[0] = np.float32(total[0])
            results[1] = c + x * y
            if bits[0] != bits[1]:
                changed += 1
            acc[index] = results[0]
        return changed
    return accumulate


@cache
def _outer() -> Callable:
    """The compiled outer-product sum over [K, R, X] and [K, R, Y] (compiled on first use): per term the
    reference's two roundings, or fused()'s one, each product and result flushed to zero where ``ftz`` (the
    operands come flushed); counts of the results the fusion changed, the products and the results flushed.
    It holds no Python object, so the attention's query chunks run it side by side (nogil)."""
    from numba import njit

    from csa_conform.oracle.compiled.cache import kernel_cache

    @njit(cache=kernel_cache(), fastmath=False, nogil=True)
    def outer(a, b, summed, fused, ftz):  # pragma: no cover - compiled
        smallest = np.float32(2.0**-126)
        zero = np.float32(0.0)
        results = np.empty(2, dtype=np.float32)
        bits = results.view(np.uint32)
        total = np.empty(1, dtype=np.float64)
        total_bits = total.view(np.int64)
        counts = np.zeros(3, dtype=np.int64)  # fused changed, products flushed, results flushed
        for r in range(summed.shape[0]):
            for k in range(a.shape[0]):
                for x in range(a.shape[2]):
                    left = a[k, r, x]
                    for y in range(b.shape[2]):
                        c, right = summed[r, x, y], b[k, r, y]
                        product32 = left * right
                        if ftz and abs(product32) < smallest and product32 != zero:
                            product32 = np.float32(np.copysign(zero, product32))
                            counts[1] += 1
                        results[1] = c + product32
                        if fused:
                            product = np.float64(left) * np.float64(right)
                            addend = np.float64(c)
                            total[0] = product + addend
                            if total[0] - total[0] == 0.0:  # finite: rounded to odd
                                virtual = total[0] - product
                                error = (product - (total[0] - virtual)) + (addend - virtual)
                                if error != 0.0 and (total_bits[0] & 1) == 0:
                                    total_bits[0] += 1 if (error > 0.0) == (total[0] > 0.0) else -1
                            results[0] = np.float32(total[0])
                            if bits[0] != bits[1]:
                                counts[0] += 1
                            results[1] = results[0]
                        value = results[1]
                        if ftz and abs(value) < smallest and value != zero:
                            value = np.float32(np.copysign(zero, value))
                            counts[2] += 1
                        summed[r, x, y] = value
        return counts
    return outer


def _rows(a: np.ndarray, b: np.ndarray) -> tuple[tuple[int, ...], np.ndarray, np.ndarray]:
    """(the leading rows' shape, a as [K, rows, X], b as [K, rows, Y]): binary32, contiguous, one signature."""
    rows = a.shape[1:-1]
    count = int(np.prod(rows, dtype=np.int64))
    return (rows, np.ascontiguousarray(a, dtype=np.float32).reshape(a.shape[0], count, a.shape[-1]),
            np.ascontiguousarray(b, dtype=np.float32).reshape(b.shape[0], count, b.shape[-1]))


def outer_accumulate(a: np.ndarray, b: np.ndarray, fused: bool, ftz: bool) -> tuple[np.ndarray, np.ndarray]:
    """(Σ_k a[k, ..., X, None] * b[k, ..., None, Y] ascending in k from +0; how many terms the fusion changed,
    how many products and results were flushed): Numerics.outer_sum's per-k accumulation in one compiled call
    (numba must import), the operands flushed already where ``ftz``."""
    rows, left, right = _rows(a, b)
    summed = np.zeros((left.shape[1], a.shape[-1], b.shape[-1]), dtype=np.float32)
    counts = _outer()(left, right, summed, bool(fused), bool(ftz))
    return summed.reshape(rows + (a.shape[-1], b.shape[-1])), counts


@cache
def _wide() -> Callable:
    """The compiled outer-product sum carried in binary64 (compiled on first use): each product exact, the
    sums rounded to binary32 and widened again where the reduction index enters another tile."""
    from numba import njit

    from csa_conform.oracle.compiled.cache import kernel_cache

    @njit(cache=kernel_cache(), fastmath=False, nogil=True)
    def wide(a, b, tiles, summed):  # pragma: no cover - compiled
        for r in range(summed.shape[0]):
            for k in range(a.shape[0]):
                if k and tiles[k] != tiles[k - 1]:
                    for x in range(summed.shape[1]):
                        for y in range(summed.shape[2]):
                            summed[r, x, y] = np.float64(np.float32(summed[r, x, y]))
                for x in range(a.shape[2]):
                    left = np.float64(a[k, r, x])
                    for y in range(b.shape[2]):
                        summed[r, x, y] += left * np.float64(b[k, r, y])
    return wide


def wide_accumulate(a: np.ndarray, b: np.ndarray, tiles: np.ndarray) -> np.ndarray:
    """Σ_k a[k, ..., X, None] * b[k, ..., None, Y] ascending in k from +0 in binary64, rounded to binary32 where
    ``tiles[k]`` changes and at the end: a value sum kept in a wide accumulator per tile, in one compiled
    call (numba must import)."""
    rows, left, right = _rows(a, b)
    summed = np.zeros((left.shape[1], a.shape[-1], b.shape[-1]), dtype=np.float64)
    _wide()(left, right, np.ascontiguousarray(tiles, dtype=np.int64), summed)
    with np.errstate(over="ignore"):
        return summed.astype(np.float32).reshape(rows + (a.shape[-1], b.shape[-1]))


def fused_accumulate(acc: np.ndarray, a, b) -> int:
    """acc = fma(a, b, acc) in place, a and b broadcast to acc; how many results differ, bit for bit, from
    acc + a*b rounded twice. Compiled when numba imports (no temporaries, no copies of the broadcast
    operands), else NumPy's formulation."""
    a, b = (np.broadcast_to(np.asarray(value, dtype=np.float32), acc.shape) for value in (a, b))
    if numba_available():
        return int(_accumulator()(acc, a, b))
    return numpy_fused_accumulate(acc, a, b)


def compiled_fmaf(a, b, c) -> np.ndarray:
    """fma over broadcast binary32 arrays through the compiled loop (numba must import)."""
    a, b, c = np.broadcast_arrays(*(np.asarray(value, dtype=np.float32) for value in (a, b, c)))
    out = np.empty(a.shape, dtype=np.float32)
    _kernel()(np.ascontiguousarray(a).reshape(-1), np.ascontiguousarray(b).reshape(-1),
              np.ascontiguousarray(c).reshape(-1), out.reshape(-1))
    return out


def fmaf(a, b, c) -> np.ndarray:
    """Binary32 a*b+c rounded once: compiled when numba imports, else NumPy's formulation."""
    return compiled_fmaf(a, b, c) if numba_available() else numpy_fmaf(a, b, c)
