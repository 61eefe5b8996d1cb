"""RMSNorm's square sum in one call is the reference's loop of accumulations, bit for bit, under every variant."""

from __future__ import annotations

import numpy as np
import pytest

from csa_conform.numerics.variant import ACCUMULATE, REFERENCE, Numerics


def _loop(numerics: Numerics, x: np.ndarray) -> np.ndarray:
    total = np.zeros(x.shape[:-1], dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for column in np.moveaxis(x, -1, 0):
            numerics.accumulate(total, column, column)
    return total


def _rows(seed: int) -> np.ndarray:
    """Magnitudes from subnormal squares to overflowing ones, -0 elements, whole -0 rows, inf and NaN."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((6, 33, 512)) * np.exp2(rng.integers(-75, 70, size=(6, 33, 1)))
    x = x.astype(np.float32)
    x[rng.random(x.shape) < 0.05] = -0.0
    x[0, 0] = -0.0
    x[1, 1, 7] = np.inf
    x[2, 2, 9] = np.nan
    return x


@pytest.mark.parametrize("numerics", [REFERENCE, Numerics(fused=frozenset({ACCUMULATE})), Numerics(ftz=True)],
                         ids=["reference", "fused", "ftz"])
def test_square_sum_is_the_loop(numerics):
    for seed in range(3):
        x = _rows(seed)
        assert np.array_equal(numerics.sum_of_squares(x).view(np.uint32), _loop(numerics, x).view(np.uint32))


def test_an_all_negative_zero_row_sums_to_positive_zero():
    total = REFERENCE.sum_of_squares(np.full((2, 4), -0.0, dtype=np.float32))
    assert not np.signbit(total).any()


def test_pairwise_summation_would_differ():
    """The check above can fail: numpy's own sum of these rows is another order and other bits."""
    x = _rows(0)
    with np.errstate(over="ignore", invalid="ignore"):
        pairwise = np.sum(x * x, axis=-1, dtype=np.float32)
    assert not np.array_equal(pairwise.view(np.uint32), _loop(REFERENCE, x).view(np.uint32))


def test_an_empty_axis_sums_to_zero():
    assert np.array_equal(REFERENCE.sum_of_squares(np.zeros((3, 0), dtype=np.float32)), np.zeros(3, np.float32))


def test_a_broadcast_dot_in_blocks_is_the_loop(monkeypatch):
    """The candidates' read-back scores: q [M, N, D] against keys [M, 1, D], in blocks of leading rows."""
    import csa_conform.numerics.variant as variant

    rng = np.random.default_rng(9)
    q = (rng.standard_normal((7, 3, 64)) * np.exp2(rng.integers(-60, 60, (7, 3, 1)))).astype(np.float32)
    keys = rng.standard_normal((7, 1, 64)).astype(np.float32)
    q[0, 0] = -0.0
    loop = np.zeros((7, 3), dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for i in range(64):
            loop = loop + q[:, :, i] * keys[:, :, i]
    monkeypatch.setattr(variant, "_DOT_BLOCK", 3 * 64 * 2)  # two rows of M per block: four blocks
    dot = variant.ascending_dot(q, keys)
    assert dot.shape == (7, 3) and np.array_equal(dot.view(np.uint32), loop.view(np.uint32))
    assert np.array_equal(variant.ascending_dot(q[0, 1], keys[0, 0]).view(np.uint32), loop[0, 1].view(np.uint32))
