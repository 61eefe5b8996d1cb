"""The exact binary32 fma explain evaluates (compiled, and its NumPy fallback) equals the C library's fmaf,
which is correctly rounded (hardware FMA on x86-64), bit for bit on every edge class."""

from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import replace

import numpy as np
import pytest

from csa_conform.explain.exact_fma import compiled_fmaf, fmaf
from csa_conform.explain.exact_fma import fused_accumulate as exact_fused_accumulate
from csa_conform.explain.exact_fma import outer_accumulate, wide_accumulate
from csa_conform.numerics.variant import ACCUMULATE, Numerics
from csa_conform.numerics.variant import fmaf as numpy_fmaf
from csa_conform.numerics.variant import fused_accumulate as numpy_fused_accumulate

LIBM = ctypes.CDLL(ctypes.util.find_library("m"))
LIBM.fmaf.restype = ctypes.c_float
LIBM.fmaf.argtypes = (ctypes.c_float,) * 3

F32 = np.float32
TINY = F32(2.0**-149)
MAX = np.finfo(np.float32).max


def _bits(x):
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def _hardware(a, b, c) -> np.ndarray:
    return np.array([LIBM.fmaf(float(x), float(y), float(z)) for x, y, z in zip(a, b, c)], dtype=np.float32)


def _edge_classes(rng: np.random.Generator) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    n = 2000
    a = rng.standard_normal(n).astype(F32)
    b = rng.standard_normal(n).astype(F32)
    product = a.astype(np.float64) * b
    # ties: c puts a*b+c exactly halfway between two binary32 neighbours (odd and even low bits)
    c_tie = np.empty(n, dtype=F32)
    a_tie = np.ldexp(F32(1) + rng.integers(0, 2**23, n).astype(F32) * F32(2.0**-23), 0).astype(F32)
    b_tie = np.full(n, F32(1.5) + F32(2.0**-23))
    exact = a_tie.astype(np.float64) * b_tie
    c_tie[:] = (-(exact - exact.astype(F32).astype(np.float64))).astype(F32)
    c_tie += np.where(np.arange(n) % 2 == 0, F32(2.0**-24), F32(-(2.0**-24))) * np.ldexp(F32(1), 1)
    subnormal = rng.integers(1, 2**23, n).astype(np.float64) * 2.0**-149
    return {
        "random": (a, b, rng.standard_normal(n).astype(F32)),
        "cancellation": (a, b, (-product * (1 + rng.standard_normal(n) * 2.0**-22)).astype(F32)),
        "exact cancellation": (a, b, -(a * b)),
        "ties": (a_tie, b_tie, c_tie),
        "subnormal results": ((subnormal * 2.0**60).astype(F32), np.full(n, F32(2.0**-60)),
                              (rng.integers(-2**10, 2**10, n) * 2.0**-149).astype(F32)),
        "subnormal inputs": (subnormal.astype(F32), rng.standard_normal(n).astype(F32),
                             (rng.standard_normal(n) * 2.0**-140).astype(F32)),
        "underflow to zero": (np.full(n, TINY), (rng.random(n) * 0.75).astype(F32),
                              np.where(np.arange(n) % 2 == 0, F32(0), F32(-0.0)).astype(F32)),
        "overflow": ((rng.random(n) * 2 + 1).astype(F32) * F32(2.0**100), np.full(n, F32(2.0**28)),
                     np.where(np.arange(n) % 3 == 0, -MAX, F32(0)).astype(F32)),
        "overflow brought back": (np.full(n, MAX), np.full(n, F32(2.0)), np.full(n, -MAX)),
        "signed zeros": (np.tile(np.array([0.0, -0.0, 0.0, -0.0, 1.0, -1.0], F32), n // 6 + 1)[:n],
                         np.tile(np.array([1.0, 1.0, -1.0, -1.0, 0.0, -0.0], F32), n // 6 + 1)[:n],
                         np.tile(np.array([0.0, -0.0, -0.0, 0.0, -0.0, 0.0], F32), n // 6 + 1)[:n]),
        "infinities and NaN": (np.tile(np.array([np.inf, 0.0, np.inf, np.nan, 1.0, -np.inf], F32), n // 6 + 1)[:n],
                               np.tile(np.array([1.0, np.inf, -1.0, 1.0, 1.0, 2.0], F32), n // 6 + 1)[:n],
                               np.tile(np.array([1.0, 1.0, np.inf, 0.0, np.inf, np.inf], F32), n // 6 + 1)[:n]),
    }


EDGES = _edge_classes(np.random.default_rng(16))


@pytest.mark.parametrize("edge", list(EDGES))
@pytest.mark.parametrize("implementation", ["numpy", "compiled"])
def test_exact_fma_equals_the_hardware_fma(edge, implementation):
    if implementation == "compiled":
        pytest.importorskip("numba")
    a, b, c = EDGES[edge]
    function = compiled_fmaf if implementation == "compiled" else numpy_fmaf
    got, expected = function(a, b, c), _hardware(a, b, c)
    nan = np.isnan(expected)
    assert (np.isnan(got) == nan).all()
    assert (_bits(got)[~nan] == _bits(expected)[~nan]).all(), edge


def test_every_edge_class_is_one_where_a_single_rounding_can_matter():
    """The classes exercise what they name: ties and cancellation differ from two roundings, subnormal
    results and zeros of both signs occur, and an overflowing product comes back into range."""
    def unfused(edge):
        a, b, c = EDGES[edge]
        with np.errstate(all="ignore"):
            return (a * b + c).astype(F32)
    for edge in ("ties", "cancellation", "overflow brought back"):
        assert (_bits(unfused(edge)) != _bits(_hardware(*EDGES[edge]))).any(), edge
    results = _hardware(*EDGES["subnormal results"])
    assert ((np.abs(results) < 2.0**-126) & (results != 0)).any()
    zeros = _bits(_hardware(*EDGES["signed zeros"]))
    assert {0, 0x80000000} <= set(zeros.tolist())


def test_broadcast_shapes_and_the_dispatch():
    a = np.arange(6, dtype=F32).reshape(2, 3)
    got = fmaf(a, F32(3), np.ones((1, 3), F32))
    assert got.shape == (2, 3) and got.dtype == np.float32
    assert (_bits(got) == _bits(numpy_fmaf(a, F32(3), np.ones((1, 3), F32)))).all()


@pytest.mark.parametrize("edge", list(EDGES))
@pytest.mark.parametrize("implementation", ["numpy", "compiled"])
def test_an_accumulation_in_place_is_the_hardware_fma_and_counts_what_fusing_changed(edge, implementation):
    """acc = fma(a, b, acc): the hardware's bits, and the count of results that differ, bit for bit, from
    acc + a*b rounded twice (a NaN of another payload counts; the same NaN does not)."""
    if implementation == "compiled":
        pytest.importorskip("numba")
    a, b, c = EDGES[edge]
    acc = c.copy()
    function = exact_fused_accumulate if implementation == "compiled" else numpy_fused_accumulate
    changed = function(acc, a, b)
    expected = _hardware(a, b, c)
    nan = np.isnan(expected)
    assert (np.isnan(acc) == nan).all() and (_bits(acc)[~nan] == _bits(expected)[~nan]).all(), edge
    with np.errstate(all="ignore"):
        twice = c + a * b
    assert changed == int(np.count_nonzero(_bits(twice) != _bits(acc)))


def test_an_accumulation_reads_broadcast_operands_without_copying_them():
    rng = np.random.default_rng(5)
    acc = rng.standard_normal((3, 4, 5)).astype(F32)
    a, b = rng.standard_normal((3, 4, 1)).astype(F32), rng.standard_normal((1, 5)).astype(F32)
    expected = acc.copy()
    numpy_fused_accumulate(expected, a, b)
    changed = exact_fused_accumulate(acc, a, b)
    assert (_bits(acc) == _bits(expected)).all() and changed >= 0
    with pytest.raises(ValueError):
        exact_fused_accumulate(acc, a, np.ones((2, 5), F32))


@pytest.mark.parametrize("edge", list(EDGES))
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("ftz", [False, True])
def test_an_outer_sum_in_one_call_is_the_accumulation_once_per_index(edge, fused, ftz):
    """Attention's logit dots and value sums summed whole by the compiled loop: bit for bit what accumulate()
    once per reduction index gives, fused or rounded twice, flushing subnormals or not (NaNs included), with
    the same counts of results the fusion changed and of values flushed."""
    pytest.importorskip("numba")
    a, b, _ = EDGES[edge]
    left, right = a[:6 * 4 * 3].reshape(6, 2, 2, 3), b[:6 * 4 * 5].reshape(6, 2, 2, 5)
    if ftz:
        left = left * F32(2.0**-120)  # some operands, products and results below the smallest normal
    fusing = frozenset({ACCUMULATE}) if fused else frozenset()
    once, each = {}, {}
    got = Numerics(fused=fusing, ftz=ftz, tallies=once, outer_accumulation=outer_accumulate).outer_sum(left, right)
    expected = Numerics(fused=fusing, ftz=ftz, tallies=each).outer_sum(left, right)
    assert got.shape == expected.shape == (2, 2, 3, 5)
    assert (_bits(got) == _bits(expected)).all(), edge
    assert [(name, tally.changed, tally.seen) for name, tally in once.items()] == \
        [(name, tally.changed, tally.seen) for name, tally in each.items()]
    assert ("fused accumulation" in once) == fused and ("subnormal" in once) == ftz


def test_flushing_and_fusing_are_seen_by_the_outer_sum():
    """The classes the sum must get right do occur: subnormal products flushed, fusion changing results."""
    pytest.importorskip("numba")
    rng = np.random.default_rng(3)
    left = (rng.standard_normal((64, 2, 3)) * 2.0**-70).astype(F32)
    right = (rng.standard_normal((64, 2, 5)) * 2.0**-60).astype(F32)
    tallies = {}
    Numerics(fused=frozenset({ACCUMULATE}), ftz=True, tallies=tallies,
             outer_accumulation=outer_accumulate).outer_sum(left, right)
    assert tallies["subnormal"].changed > 0 and tallies["fused accumulation"].seen == 64 * 2 * 3 * 5
    tallies = {}
    Numerics(fused=frozenset({ACCUMULATE}), tallies=tallies, outer_accumulation=outer_accumulate).outer_sum(
        rng.standard_normal((256, 2, 3)).astype(F32), rng.standard_normal((256, 2, 5)).astype(F32))
    assert tallies["fused accumulation"].changed > 0


@pytest.mark.parametrize("shapes", [((0, 2, 3), (0, 2, 4)), ((3, 0, 2), (3, 0, 5)), ((4, 1, 1), (4, 1, 1))])
def test_an_outer_sum_of_nothing_or_of_one_element(shapes):
    pytest.importorskip("numba")
    rng = np.random.default_rng(7)
    left, right = (rng.standard_normal(shape).astype(F32) for shape in shapes)
    for fusing in (frozenset(), frozenset({ACCUMULATE})):
        for ftz in (False, True):
            once, each = {}, {}
            got = Numerics(fused=fusing, ftz=ftz, tallies=once, outer_accumulation=outer_accumulate).outer_sum(
                left, right)
            expected = Numerics(fused=fusing, ftz=ftz, tallies=each).outer_sum(left, right)
            assert got.shape == expected.shape and (_bits(got) == _bits(expected)).all()
            assert [(name, tally.changed, tally.seen) for name, tally in once.items()] == \
                [(name, tally.changed, tally.seen) for name, tally in each.items()]


@pytest.mark.parametrize("tile", [None, 0, 2, 3])
def test_a_value_sum_carried_in_binary64_in_one_call_is_the_numpy_pass_per_index(tile):
    """A port's wide accumulator, rounded where the candidate slots enter another tile: the compiled sum and
    the NumPy pass per index give the same bits, overflow to infinity included."""
    pytest.importorskip("numba")
    from csa_conform.oracle.sparse_sink_softmax_attention import _binary64_values

    rng = np.random.default_rng(11)
    weights = rng.random((7, 2, 3, 4)).astype(F32)
    values = rng.standard_normal((7, 2, 3, 6)).astype(F32)
    weights[2:4, 0, 1] = 1
    values[2:4, 0, 1, :2] = MAX  # 2 MAX in binary64: infinity once rounded
    slots = np.array([0, 1, 2, 4, 5, 9, 10])
    numerics = Numerics(binary64_values=tile or 0)
    expected = _binary64_values(weights, values, slots, numerics)
    got = _binary64_values(weights, values, slots, replace(numerics, wide_accumulation=wide_accumulate))
    assert got.dtype == np.float32 and got.shape == (2, 3, 4, 6)
    assert (_bits(got) == _bits(expected)).all() and np.isinf(got).any()
