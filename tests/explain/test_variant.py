"""The numerics seam: binary32 fma, flush-to-zero, and the reference variant being the oracle itself."""

from __future__ import annotations

import ctypes
import ctypes.util
import math

import numpy as np
import pytest

from csa_conform.explain.hypotheses import correctly_rounded
from csa_conform.numerics import libm
from csa_conform.numerics.bf16 import bf16_bits
from csa_conform.numerics.variant import (
    ACCUMULATE,
    PAIRS_FIRST,
    PAIRS_SECOND,
    REFERENCE,
    SUMS_FIRST,
    Numerics,
    Tally,
    flush,
    fmaf,
)

LIBM = ctypes.CDLL(ctypes.util.find_library("m"))
LIBM.fmaf.restype = ctypes.c_float
LIBM.fmaf.argtypes = (ctypes.c_float,) * 3


def _bits(x):
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def test_fmaf_rounds_once_like_the_c_library():
    """glibc's fmaf is correctly rounded; products near a halfway point are where a double-rounded sum fails."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal(4000).astype(np.float32)
    b = rng.standard_normal(4000).astype(np.float32)
    c = (-(a.astype(np.float64) * b) * (1 + rng.standard_normal(4000) * 2.0**-20)).astype(np.float32)
    c[:1000] = rng.standard_normal(1000).astype(np.float32) * np.float32(2.0**-30)
    expected = np.array([LIBM.fmaf(float(x), float(y), float(z)) for x, y, z in zip(a, b, c)], dtype=np.float32)
    assert (_bits(fmaf(a, b, c)) == _bits(expected)).all()
    unfused = (a * b + c).astype(np.float32)
    assert (_bits(unfused) != _bits(expected)).any(), "the sample must contain cases where fusing matters"


def test_fmaf_keeps_infinities_and_nans():
    inf = np.float32(np.inf)
    assert fmaf(np.float32(1), inf, np.float32(1)) == inf
    assert np.isnan(fmaf(np.float32(0), inf, np.float32(1)))


def test_flush_zeroes_subnormals_keeping_the_sign():
    values = np.array([1e-40, -1e-40, 2.0**-126, -0.0, 1.0], dtype=np.float32)
    assert _bits(flush(values)).tolist() == [0, 0x80000000, 0x00800000, 0x80000000, 0x3F800000]


def test_a_variant_applies_only_where_it_is_passed():
    tie = np.float32(1 + 2.0**-8)  # halfway between two bf16 values: the even one is 1.0
    assert REFERENCE.is_reference and int(bf16_bits(tie)) == 0x3F80
    assert int(bf16_bits(tie, Numerics(bf16_rounding="ties-away"))) == 0x3F81
    assert int(bf16_bits(tie)) == 0x3F80


def test_accumulate_and_pair_fuse_as_named():
    rng = np.random.default_rng(3)
    a, b, c, d = (rng.standard_normal(2000).astype(np.float32) for _ in range(4))
    acc = rng.standard_normal(2000).astype(np.float32)
    fused = acc.copy()
    tallies: dict[str, Tally] = {}
    Numerics(fused=frozenset({ACCUMULATE}), tallies=tallies).accumulate(fused, a, b)
    assert (_bits(fused) == _bits(fmaf(a, b, acc))).all()
    assert 0 < tallies["fused accumulation"].changed < tallies["fused accumulation"].seen == 2000
    first = Numerics(fused=frozenset({PAIRS_FIRST})).pair(a, b, c, d, -1)
    second = Numerics(fused=frozenset({PAIRS_SECOND})).pair(a, b, c, d, -1)
    assert (_bits(first) == _bits(fmaf(a, b, -(c * d)))).all()
    assert (_bits(second) == _bits(fmaf(-c, d, a * b))).all()
    assert (_bits(REFERENCE.pair(a, b, c, d, -1)) == _bits(a * b - c * d)).all()
    sums = Numerics(fused=frozenset({SUMS_FIRST}))
    assert (_bits(sums.pair(a, b, c, d, +1)) == _bits(fmaf(a, b, c * d))).all()
    assert (_bits(sums.pair(a, b, c, d, -1)) == _bits(a * b - c * d)).all()


@pytest.mark.parametrize("name", ["expf", "sinf", "cosf", "log2f"])
def test_correctly_rounded_is_float_of_the_double_function(name):
    rng = np.random.default_rng(5)
    x = np.abs(rng.standard_normal(500)).astype(np.float32) * np.float32(3)
    function = {"expf": math.exp, "sinf": math.sin, "cosf": math.cos, "log2f": math.log2}[name]
    expected = np.array([function(float(v)) for v in x]).astype(np.float32)
    assert (_bits(correctly_rounded(name)(x)) == _bits(expected)).all()
    specials = np.array([np.inf, -np.inf, 0.0, 1000.0], dtype=np.float32)
    with np.errstate(all="ignore"):
        correctly_rounded(name)(specials)  # no exception for overflow, domain errors or infinities


def test_block_scale_exponent_is_the_same_with_a_correctly_rounded_log2f():
    """Why the block-scale switch is invisible on the host: ceil(log2f(q)) only changes where log2 is near
    an integer, i.e. q near a power of two, and there glibc's log2f and the correctly rounded one agree."""
    exponents = np.arange(-126, 127)
    offsets = np.arange(-512, 513)
    bits = ((exponents[:, None] + 127) << 23) + offsets[None, :]
    q = bits[(bits > 0x00800000) & (bits < 0x7F800000)].astype(np.uint32).view(np.float32)
    assert (np.ceil(libm.log2f(q)) == np.ceil(correctly_rounded("log2f")(q))).all()


def test_the_value_sum_alone_fused_leaves_the_logits_rounded_apart():
    """On a closed-form case (its logit products are not exact in binary32) fusing every accumulation moves the
    attention scores, and fusing the P·V value sum alone moves Y but leaves the scores the reference's: the
    variant a kernel that contracts only its P·V loop computes. Fusing the logit dots alone is the other loop."""
    from ci_steps import first_step

    from csa_conform.explain.stages import run_stage
    from csa_conform.numerics.variant import LOGIT_ACCUMULATE, VALUE_ACCUMULATE

    g, inputs, expected = first_step("seed-closed-form.r4-prefill-8")
    stage = "sparse_sink_softmax_attention"
    every = run_stage(stage, g, inputs, expected, Numerics(fused=frozenset({ACCUMULATE})))
    values = run_stage(stage, g, inputs, expected, Numerics(fused=frozenset({VALUE_ACCUMULATE})))
    reference = expected[stage]
    assert (_bits(values["scores"]) == _bits(reference["scores"])).all()
    assert (_bits(every["scores"]) != _bits(reference["scores"])).any()
    assert (_bits(values["Y"]) != _bits(reference["Y"])).any()
    # the logit dots alone fused: the scores every accumulation fused computes, Y from the value sum rounded apart
    logits = run_stage(stage, g, inputs, expected, Numerics(fused=frozenset({LOGIT_ACCUMULATE})))
    assert (_bits(logits["scores"]) == _bits(every["scores"])).all()
    assert (_bits(logits["Y"]) != _bits(every["Y"])).any()
