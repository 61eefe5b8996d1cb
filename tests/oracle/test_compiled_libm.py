"""The numba engine's libm is the NumPy port's, bit for bit, on every kind of binary32 input.

A sample of the whole binary32 range, random patterns, the special values
and, per function, the arguments where its algorithm switches branch or
rounds delicately: multiples of pi/2 and huge arguments for sinf/cosf, the
softmax range for expf, 1 and the subnormals for log2f.
"""

from __future__ import annotations

import numpy as np
import pytest
from engine_pairs import needs_numba

from csa_conform.numerics import libm

pytestmark = needs_numba

SPECIALS = np.array(
    [
        0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007FFFFF, 0x807FFFFF, 0x00800000, 0x80800000,
        0x3F800000, 0xBF800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000,
        0x7FC00000, 0xFFC00000, 0x7FC00001, 0xFFC12345, 0x7F800001, 0xFF800001, 0x7FBFFFFF,
    ],
    dtype=np.uint32,
).view(np.float32)


def _with_neighbours(values, reach: int = 4) -> np.ndarray:
    """Each binary32 value and the `reach` patterns on either side of it."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.int64)
    offsets = np.arange(-reach, reach + 1)
    return np.clip(bits[:, None] + offsets, 0, 2**32 - 1).astype(np.uint32).ravel().view(np.float32)


def _pi_multiples() -> np.ndarray:
    """k pi/2 for |k| up to 2^20, and a spread of k up to binary32's largest arguments."""
    small = np.arange(-(1 << 20), 1 << 20, dtype=np.float64)
    large = np.geomspace(1 << 20, 2.0**128 / np.pi, 1 << 14)
    turns = np.concatenate([small, large, -large]) * (np.pi / 2)
    return _with_neighbours(turns[np.abs(turns) < 3.4e38].astype(np.float32), 2)


def _function_inputs(name: str, rng) -> np.ndarray:
    if name in ("sinf", "cosf"):
        return np.concatenate([_pi_multiples(), rng.uniform(-1e4, 1e4, 1 << 20).astype(np.float32)])
    if name == "expf":
        bounds = [libm._EXPF_OVERFLOW, libm._EXPF_UNDERFLOW, libm._EXPF_MAY_UNDERFLOW]
        return np.concatenate([np.linspace(-110, 95, 1 << 20, dtype=np.float32), _with_neighbours(bounds, 64)])
    return np.concatenate([
        np.linspace(0.5, 2, 1 << 20, dtype=np.float32),
        np.arange(1, 1 << 23, 7, dtype=np.uint32).view(np.float32),
    ])


@pytest.mark.parametrize("name", ["expf", "sinf", "cosf", "log2f"])
def test_compiled_port_is_the_numpy_port_bit_for_bit(name):
    """Every 997th binary32 pattern, 2^20 random patterns, the specials and the function's own hard inputs."""
    from compiled_libm_arrays import evaluate

    rng = np.random.default_rng(0)
    patterns = np.concatenate([
        np.arange(0, 1 << 32, 997, dtype=np.uint64).astype(np.uint32),
        rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32),
    ])
    x = np.concatenate([patterns.view(np.float32), SPECIALS, _function_inputs(name, rng)])
    compiled = evaluate(name, x).view(np.uint32)
    ported = getattr(libm, name)(x).view(np.uint32)
    differing = np.flatnonzero(compiled != ported)
    assert differing.size == 0, f"{differing.size} inputs differ, first {x[differing[0]]!r}"


def test_compiled_fma_is_the_numpy_emulation():
    from csa_conform.oracle.compiled.libm_kernels import fma

    rng = np.random.default_rng(1)
    a, b, c = (rng.standard_normal(1 << 12) * 2.0 ** rng.integers(-60, 60, 1 << 12) for _ in range(3))
    compiled = np.array([fma(*operands) for operands in zip(a, b, c)])
    assert np.array_equal(compiled.view(np.uint64), libm.fma(a, b, c).view(np.uint64))
