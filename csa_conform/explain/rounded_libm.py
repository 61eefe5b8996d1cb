"""(float)f((double)x) with the host's double libm over whole arrays: the correctly-rounded hypotheses.

The reference is glibc's binary32 function; a kernel calling the double
function and rounding once gets the correctly rounded result almost always.
With numba the loop is compiled and math.exp & co. are the C library's
double functions, the ones Python's math module calls, so the bits are
those of the elementwise Python loop (tests/explain/test_rounded_libm.py
compares them on edge and random arguments); without numba that loop runs.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from csa_conform.oracle.engine import numba_available

NAMES = ("expf", "sinf", "cosf", "log2f", "powf")


def _guarded(function: Callable[..., float]) -> Callable[..., float]:
    def evaluate(*args: float) -> float:
        try:
            return function(*args)
        except OverflowError:
            return math.inf
        except ValueError:
            return math.nan
    return evaluate


def _exp(x: float) -> float:
    return 0.0 if x == -math.inf else _guarded(math.exp)(x)


def _log2(x: float) -> float:
    if x == 0:
        return -math.inf
    return math.inf if x == math.inf else _guarded(math.log2)(x)


def _pow(x: float, y: float) -> float:
    """C's pow: IEEE results where Python's raises (zero to a negative power, overflow keeping the sign of an
    odd power, a negative base to a fraction)."""
    if math.isfinite(x) and math.isfinite(y):
        try:
            return math.pow(x, y)
        except (ValueError, OverflowError):
            pass
    with np.errstate(all="ignore"):
        return float(np.power(np.float64(x), np.float64(y)))


SCALAR = {"expf": _exp, "sinf": _guarded(math.sin), "cosf": _guarded(math.cos), "log2f": _log2, "powf": _pow}


def elementwise(name: str) -> Callable:
    """The Python loop: one double libm call per element."""
    scalar = SCALAR[name]
    universal = np.frompyfunc(lambda *args: scalar(*(float(arg) for arg in args)), 2 if name == "powf" else 1, 1)

    def evaluate(*args):
        arrays = [np.asarray(arg, dtype=np.float32) for arg in args]
        with np.errstate(all="ignore"):
            return np.asarray(universal(*arrays), dtype=np.float64).astype(np.float32)
    return evaluate


_COMPILED: dict[str, Callable] = {}


def _compiled(name: str) -> Callable:
    """The numba ufunc of one function (compiled on first use, fastmath off)."""
    if name not in _COMPILED:
        from numba import vectorize

        if name == "powf":
            def kernel(x, y):
                return math.pow(x, y)
            _COMPILED[name] = vectorize(["float64(float64, float64)"])(kernel)
        else:
            function = {"expf": math.exp, "sinf": math.sin, "cosf": math.cos, "log2f": math.log2}[name]

            def kernel(x):
                return function(x)
            _COMPILED[name] = vectorize(["float64(float64)"])(kernel)
    return _COMPILED[name]


def correctly_rounded(name: str) -> Callable:
    """(float)f((double)x) elementwise over binary32 arrays: compiled when numba imports."""
    if not numba_available():
        return elementwise(name)

    def evaluate(*args):
        with np.errstate(all="ignore"):
            doubles = [np.asarray(arg, dtype=np.float32).astype(np.float64) for arg in args]
            return np.asarray(_compiled(name)(*doubles)).astype(np.float32)
    return evaluate
