"""The compiled correctly-rounded libm gives the bits of the elementwise loop over the C library's
double functions, on random binary32 patterns and every edge class (zeros, subnormals, infinities,
NaN, overflow and underflow thresholds, negative bases)."""

import numpy as np
import pytest

from csa_conform.explain import rounded_libm
from csa_conform.oracle.engine import numba_available

EDGES = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1.1754942e-38, 88.72284, 88.72283, 89.0,
                  -103.97208, -104.0, -150.0, 1.0, -1.0, 0.5, 2.0, 3.4028235e38, -3.4028235e38, 1e30, 160000.0],
                 np.float32)


def _bits(x):
    return np.where(np.isnan(x), np.float32(np.nan), x).view(np.uint32)


@pytest.mark.skipif(not numba_available(), reason="numba is not installed: the elementwise loop is the only one")
@pytest.mark.parametrize("name", rounded_libm.NAMES)
def test_compiled_matches_the_elementwise_loop(name):
    rng = np.random.default_rng(6)
    x = np.concatenate([rng.integers(0, 2**32, 20_000, dtype=np.uint64).astype(np.uint32).view(np.float32), EDGES])
    arguments = (x,)
    if name == "powf":
        y = np.concatenate([rng.integers(0, 2**32, 20_000, dtype=np.uint64).astype(np.uint32).view(np.float32),
                            np.float32([0.5, -1, 0, 1, 2, 3, -2.5, np.inf, -np.inf, np.nan, 1e-45, 100, -100, 0.25,
                                        -0.0, 1e30, -1e30, 7, -7, 0.75, 3.5, -0.5])])
        arguments = (np.concatenate([x, -np.abs(x[:100])]), np.concatenate([y, np.float32([2, 3] * 50)]))
    fast = rounded_libm.correctly_rounded(name)(*arguments)
    slow = rounded_libm.elementwise(name)(*arguments)
    assert (_bits(fast) == _bits(slow)).all()
