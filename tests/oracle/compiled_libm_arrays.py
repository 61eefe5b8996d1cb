"""The compiled libm ports over whole arrays, for the tests that compare them with the NumPy ports.

The engine's kernels call the scalar ports directly. These loops are compiled
here without the on-disk cache, so calling them also makes numba compile the
scalar ports in this process, where the fused multiply-add scan can read them.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from csa_conform.oracle.compiled import libm_kernels as compiled_libm

FUNCTIONS = ("expf", "sinf", "cosf", "log2f")


def _loop(function):
    @njit(fastmath=False)
    def each(x, out):
        for i in range(x.size):
            out[i] = function(x[i])

    return each


_LOOPS = {name: _loop(getattr(compiled_libm, name)) for name in FUNCTIONS}


def evaluate(name: str, x) -> np.ndarray:
    """compiled_libm.NAME of every element of a binary32 array."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty(x.size, dtype=np.float32)
    _LOOPS[name](x.reshape(-1), out)
    return out.reshape(x.shape)
