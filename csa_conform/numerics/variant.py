"""Numerics variants: the oracle's arithmetic with one ingredient swapped.

The oracle computes the CPU reference's arithmetic: glibc's binary32 libm,
every a*b+c rounded twice, subnormals kept. A kernel that differs usually
differs in exactly one of those ingredients: another libm (correctly rounded,
or CUDA's), fused multiply-adds (--fmad=true), flush-to-zero. A ``Numerics``
names one such combination; the oracle's stage code receives it as an argument
(``numerics=``, REFERENCE by default) and asks it for its libm functions, its
accumulations and its a*b±c*d pairs, so ``explain`` can re-run a stage under a
variant (``run_stage(..., numerics)``, an engine bound to it) and see whether it
reproduces a device payload bit for bit. REFERENCE, the default, is the
reference itself and costs nothing extra. Nothing here is process-wide: two
re-runs under different variants (or threads of one) never see each other's.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Mapping

import numpy as np

from csa_conform.numerics import libm
from csa_conform.numerics.memo import Remembered

LIBM = ("expf", "sinf", "cosf", "powf", "log2f")
# exp2f is no function of the reference's: a fast-math expf calls it, and a probe of the device's compares with it
GLIBC: Mapping[str, Callable] = MappingProxyType({name: Remembered(getattr(libm, name)) for name in LIBM + ("exp2f",)})

ACCUMULATE = "accumulate"  # acc + a*b -> fma(a, b, acc) in every dot product and product sum
# ... in attention's P·V value sum alone (its logit dots rounded apart): a compiler contracts one loop, not both
VALUE_ACCUMULATE = "accumulate-values"
LOGIT_ACCUMULATE = "accumulate-logits"  # ... in its logit dots alone (the P·V value sum rounded apart)
PAIRS_FIRST = "pairs-first"  # a*b ± c*d -> fma(a, b, ±c*d)
PAIRS_SECOND = "pairs-second"  # a*b ± c*d -> fma(±c, d, a*b)
SUMS_FIRST = "sums-first"  # only a*b + c*d -> fma(a, b, c*d) (NVCC has been seen to fuse sums, not differences)
SUMS_SECOND = "sums-second"  # only a*b + c*d -> fma(c, d, a*b)
PAIR_FUSIONS = (PAIRS_FIRST, PAIRS_SECOND, SUMS_FIRST, SUMS_SECOND)

_SMALLEST_NORMAL = np.float32(2.0**-126)
VALUE_SUM = "value-sum output"  # the tally of attention's output elements a value-sum variant changes
LOGIT_SUM = "logit-dot result"  # the tally of attention's logit dots a binary64 logit sum changes


def fmaf(a, b, c) -> np.ndarray:
    """Binary32 a*b+c with one rounding: the exact product in float64, an exact two-sum with c,
    rounded to odd in float64 (which a later rounding to binary32 cannot double-round)."""
    a, b, c = (np.asarray(value, dtype=np.float64) for value in (a, b, c))
    with np.errstate(all="ignore"):
        product = a * b
        total = product + c
        virtual = total - product
        error = (product - (total - virtual)) + (c - virtual)
        bits = total.view(np.int64)
        nudge = (error != 0) & ((bits & 1) == 0) & np.isfinite(total)
        away = (error > 0) == (total > 0)
        odd = (bits + np.where(away, 1, -1) * nudge).view(np.float64)
        return np.where(np.isfinite(total), odd, total).astype(np.float32)


_DOT_BLOCK = 1 << 22  # products per accumulate call in ascending_dot: 16 MiB of binary32


def ascending_dot(a, b) -> np.ndarray:
    """Σ a*b over the last axis (a and b broadcast), ascending from +0, each product and partial sum rounded to
    binary32: the reference's loop ``acc = acc + a[..., i] * b[..., i]`` in one numpy accumulate per block of
    leading rows (accumulate is that recurrence in order; numpy's reductions sum pairwise, another order).
    +0 plus the last partial sum is the loop's result, a -0 made +0 as the loop's first addition makes it."""
    a, b = (np.asarray(value, dtype=np.float32) for value in (a, b))
    shape = np.broadcast_shapes(a.shape, b.shape)
    if len(shape) == 1:
        return ascending_dot(a[None], b[None])[0]
    total = np.zeros(shape[:-1], dtype=np.float32)
    if not shape[-1] or not total.size:
        return total
    a, b = np.broadcast_to(a, shape), np.broadcast_to(b, shape)
    rows = max(1, _DOT_BLOCK // math.prod(shape[1:]))
    with np.errstate(over="ignore", invalid="ignore"):
        for start in range(0, shape[0], rows):
            block = slice(start, start + rows)
            total[block] += np.add.accumulate(a[block] * b[block], axis=-1)[..., -1]
    return total


def fused_accumulate(acc: np.ndarray, a, b) -> int:
    """acc = fmaf(a, b, acc) in place; how many results differ, bit for bit, from acc + a*b rounded twice."""
    with np.errstate(over="ignore", invalid="ignore"):
        separate = acc + a * b
    contracted = fmaf(a, b, acc)
    changed = int(np.count_nonzero(separate.view(np.uint32) != contracted.view(np.uint32)))
    acc[...] = contracted
    return changed


def flush(x) -> np.ndarray:
    """Subnormal binary32 values to a zero of the same sign (what --ftz=true does to inputs and results)."""
    x = np.asarray(x, dtype=np.float32)
    return np.where(np.abs(x) < _SMALLEST_NORMAL, np.copysign(np.float32(0), x), x).astype(np.float32)


@dataclass
class Tally:
    """How many arguments (or operations) a swapped ingredient changed, of how many it saw. The oracle's
    stages count from several threads (query chunks), and counting releases the GIL: each count is added
    under a lock, or one thread's sum overwrites another's."""

    changed: int = 0
    seen: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, reference: np.ndarray, swapped: np.ndarray) -> None:
        reference, swapped = np.asarray(reference), np.asarray(swapped)
        self.add_counts(int(np.count_nonzero(reference.view(np.uint32) != swapped.view(np.uint32))), reference.size)

    def add_counts(self, changed: int, seen: int) -> None:
        with self._lock:
            self.seen += seen
            self.changed += changed


@dataclass(frozen=True)
class Numerics:
    """One combination of ingredients; ``libm`` maps a function name to its replacement."""

    libm: Mapping[str, Callable] = field(default_factory=dict)
    block_scale_log2f: Callable | None = None
    fused: frozenset[str] = frozenset()
    ftz: bool = False
    tallies: dict[str, Tally] | None = None
    trace: dict[str, list] | None = None
    bf16_rounding: str | None = None  # a convention of csa_conform.numerics.bf16.CONVENTIONS
    rope_shift: int = 0  # positions added to every RoPE position (a port rotating at the wrong position)
    rope_split_halves: bool = False  # RoPE pairs (d, d + width/2) instead of (2i, 2i+1)
    code_ties_away: bool = False  # FP8/FP4 codes round ties away from zero instead of to the even code
    fused_multiply_add: Callable = fmaf  # an exact binary32 fma (explain passes a compiled one)
    scale_folding: str | None = None  # index scoring's 1/sqrt(d)/sqrt(I) rounded another way (SCALE_FOLDINGS)
    hadamard_variant: str | None = None  # "difference-reversed" (b - a for a - b) or "skipped" (left out)
    softmax_reciprocal: bool = False  # softmax weights times the rounded 1/Z instead of divided by Z
    weights_expf: Callable | None = None  # attention's P·V weights' exp, recomputed apart from the denominator's
    # Attention's value sum accumulated as flash-attention kernels do: over the weights exp(s - m), divided by Z
    # once per output element (deferred normalization); and/or carried in binary64, rounded to binary32 once
    # per tile of this many candidate slots (0: once, at the end; None: the reference's binary32 sum).
    deferred_normalization: bool = False
    binary64_values: int | None = None
    binary64_logits: bool = False  # attention's logit dots q·k carried in binary64, rounded to binary32 once
    # A step of the stage's data flow ported another way (explain's structural hypotheses; the reference: none).
    codes_truncated: bool = False  # FP8 codes of normal values truncated toward zero instead of rounded to even
    pool_skipped: str | None = None  # a candidate slot ("first", "last") left out of the pooled sums, not the max
    overlap_boundary: int = 0  # slots the ratio-4 pool's previous/current half boundary moves (slot 4 + this)
    causal_shift: int = 0  # index scoring's causal count as (position + 1 + this) / 4
    selection_pad: int = -1  # what selection writes past a row's causal records
    selection_over_cache: bool = False  # selection ranks every record of the cache, the non-causal ones (-inf) last
    selection_key: str | None = None  # selection's sort key on the scores' bits (oracle.selection.SORT_KEYS)
    sink_in_max: bool = False  # the sink logit taken into the softmax's running max
    dense_extra: int = 0  # slots candidate assembly's dense window takes beyond the contract's
    dense_strict: bool = False  # the dense window's causal bound strict: a query's own position left out
    # what candidate assembly takes from the step's first position instead of each query's own: "dense window"
    # (its start), "causal records" (ratio 128: the records a query may attend)
    from_step_start: frozenset[str] = frozenset()
    rms_norm: str | None = None  # a key of csa_conform.oracle.pooling.RMS_NORM_PORTS (the reference: None)
    probes: dict[str, np.ndarray] | None = None  # the named sub-step outputs a probed kernel copies (explain)
    # acc = fma(a, b, acc) in place, returning how many results the fusion changed (explain: a compiled one)
    fused_accumulation: Callable[..., int] = fused_accumulate
    # (a, b, fused, ftz) -> (outer_sum's result, [results the fusion changed, products flushed, results flushed])
    # in one pass, the operands flushed already where ftz (explain: a compiled one; None: accumulate() once per
    # reduction index)
    outer_accumulation: Callable | None = None
    # (a, b, tiles) -> the outer sum carried in binary64, rounded where the tile changes and at the end, in one
    # pass (explain: a compiled one; None: a NumPy pass per reduction index)
    wide_accumulation: Callable | None = None

    @property
    def is_reference(self) -> bool:
        return (not self.libm and self.block_scale_log2f is None and not self.fused and not self.ftz
                and self.bf16_rounding is None and not self.rope_shift and not self.rope_split_halves
                and not self.code_ties_away and self.scale_folding is None and self.hadamard_variant is None
                and not self.softmax_reciprocal and self.weights_expf is None and not self.codes_truncated
                and not self.deferred_normalization and self.binary64_values is None and not self.binary64_logits
                and self.pool_skipped is None and not self.overlap_boundary and not self.causal_shift
                and self.selection_pad == -1 and not self.selection_over_cache and self.selection_key is None
                and not self.sink_in_max and not self.dense_extra and not self.dense_strict
                and not self.from_step_start and self.rms_norm is None)

    def count_bf16(self, reference, swapped) -> None:
        """Tally the bf16 roundings the convention changed (bit patterns widened to 32 bits)."""
        self._count("bf16 rounding", np.asarray(reference, np.uint32), np.asarray(swapped, np.uint32))

    def count(self, name: str, reference, swapped) -> None:
        """Tally the values a swapped step of a stage's own code changed (while explain counts)."""
        self._count(name, reference, swapped)

    @property
    def counting(self) -> bool:
        return self.tallies is not None

    def _count(self, name: str, reference, swapped) -> None:
        if self.tallies is not None:
            self.tallies.setdefault(name, Tally()).add(reference, swapped)

    def _flush(self, x) -> np.ndarray:
        """flush() when this variant flushes, counting the values it zeroes."""
        if not self.ftz:
            return np.asarray(x, dtype=np.float32)
        x = np.asarray(x, dtype=np.float32)
        flushed = flush(x)
        self._count("subnormal", x, flushed)
        return flushed

    def _libm(self, name: str, *args) -> np.ndarray:
        args = tuple(self._flush(arg) for arg in args) if self.ftz else args
        reference = GLIBC[name](*args)
        result = reference
        if name in self.libm:
            result = np.asarray(self.libm[name](*args), dtype=np.float32)
            self._count(name, reference, result)
        return self._flush(result) if self.ftz else result

    def expf(self, x):
        return self._libm("expf", x)

    def sinf(self, x):
        return self._libm("sinf", x)

    def cosf(self, x):
        return self._libm("cosf", x)

    def weight_exp(self, x):
        """The exp of attention's P·V weights: the stage's expf unless a variant recomputes them otherwise."""
        if self.weights_expf is None:
            return self.expf(x)
        result = np.asarray(self.weights_expf(x), dtype=np.float32)
        self._count("P·V weights' expf", GLIBC["expf"](x), result)
        return result

    def powf(self, x, y):
        return self._libm("powf", x, y)

    def log2f(self, x):
        return self._libm("log2f", x)

    def block_scale_log2(self, x):
        """The log2f the E8M0 block scale takes (ceil(log2f(amax / max_code)))."""
        if self.block_scale_log2f is None:
            return self.log2f(x)
        reference = GLIBC["log2f"](x)
        result = np.asarray(self.block_scale_log2f(x), dtype=np.float32)
        self._count("block-scale log2f", reference, result)
        return result

    def accumulate(self, acc: np.ndarray, a, b, product: np.ndarray | None = None, value_sum: bool = False,
                   logit_dot: bool = False) -> None:
        """acc += a*b in place: two roundings (the reference, and any variant that neither fuses
        accumulations nor flushes) or one (fused: every accumulation, or ``value_sum``'s or ``logit_dot``'s
        alone)."""
        fused = self._fuses(value_sum, logit_dot)
        if not fused and not self.ftz:
            if product is None:
                acc += a * b
            else:
                np.multiply(a, b, out=product)
                np.add(acc, product, out=acc)
            return
        if not self.ftz:
            self._tally("fused accumulation", self.fused_accumulation(acc, a, b), acc.size)
            return
        a, b = (self._flush(v) for v in (a, b))
        with np.errstate(over="ignore", invalid="ignore"):
            separate = acc + self._flush(a * b)
        if fused:
            contracted = self.fused_multiply_add(a, b, acc)
            self._count("fused accumulation", separate, contracted)
            separate = contracted
        acc[...] = self._flush(separate)

    def outer_sum(self, a: np.ndarray, b: np.ndarray, value_sum: bool = False, logit_dot: bool = False) -> np.ndarray:
        """[..., X, Y] = Σ_k a[k, ..., X, None] * b[k, ..., None, Y], ascending in k from +0, each term as
        accumulate() adds it, and counted as it counts: in one pass where ``outer_accumulation`` is given, else
        accumulate() once per k (a dot product of tiny rows is all per-call overhead there)."""
        if self.outer_accumulation is not None and a.shape[0]:
            fused = self._fuses(value_sum, logit_dot)
            if self.ftz:
                a, b = self._flush(a), self._flush(b)
            summed, (changed, products, results) = self.outer_accumulation(a, b, fused, self.ftz)
            terms = summed.size * a.shape[0]
            if self.ftz:
                self._tally("subnormal", int(products) + int(results), 2 * terms)
            if fused:
                self._tally("fused accumulation", int(changed), terms)
            return summed
        summed = np.zeros(a.shape[1:] + b.shape[-1:], dtype=np.float32)
        product = np.empty_like(summed)
        with np.errstate(over="ignore", invalid="ignore"):
            for x, y in zip(a, b):
                self.accumulate(summed, x[..., None], y[..., None, :], product, value_sum, logit_dot)
        return summed

    def _fuses(self, value_sum: bool, logit_dot: bool) -> bool:
        return (ACCUMULATE in self.fused or (value_sum and VALUE_ACCUMULATE in self.fused)
                or (logit_dot and LOGIT_ACCUMULATE in self.fused))

    def _tally(self, name: str, changed: int, seen: int) -> None:
        if self.tallies is not None:
            self.tallies.setdefault(name, Tally()).add_counts(changed, seen)

    def sum_of_squares(self, x: np.ndarray) -> np.ndarray:
        """Σ x*x over the last axis, ascending from +0: accumulate() once per element, or, where that rounds
        each product and partial sum to binary32 (no fused accumulation, no flush), ascending_dot."""
        if ACCUMULATE not in self.fused and not self.ftz:
            return ascending_dot(x, x)
        total = np.zeros(x.shape[:-1], dtype=np.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            for column in np.moveaxis(x, -1, 0):
                self.accumulate(total, column, column)
        return total

    def pair(self, a, b, c, d, sign: int = 1) -> np.ndarray:
        """a*b + sign*c*d: both products rounded (the reference) or one of them fused into the sum."""
        with np.errstate(over="ignore", invalid="ignore"):
            first, second = a * b, c * d
            if self.ftz:
                first, second = self._flush(first), self._flush(second)
            result = first + second if sign > 0 else first - second
            which = self._pair_fusion(sign)
            if which is not None:
                fma = self.fused_multiply_add
                fused = fma(a, b, sign * second) if which == "first" else fma(np.float32(sign) * c, d, first)
                self._count("fused pairs", result, fused)
                result = fused
        return self._flush(result) if self.ftz else np.asarray(result, dtype=np.float32)

    def _pair_fusion(self, sign: int) -> str | None:
        """Which product of a*b + sign*c*d this variant fuses ('first', 'second' or None)."""
        if PAIRS_FIRST in self.fused or (sign > 0 and SUMS_FIRST in self.fused):
            return "first"
        if PAIRS_SECOND in self.fused or (sign > 0 and SUMS_SECOND in self.fused):
            return "second"
        return None

    def normalized(self, weights: np.ndarray, denominator: np.ndarray) -> np.ndarray:
        """The softmax weights over their denominator: divided (the reference) or times its rounded reciprocal."""
        quotient = weights / denominator
        if not self.softmax_reciprocal:
            return quotient
        with np.errstate(divide="ignore"):  # a row without candidates: its Z is 0 and its weights are dropped
            product = weights * (np.float32(1) / denominator)
        self._count("softmax division", quotient, product)
        return product

    def dequantized(self, values: np.ndarray) -> np.ndarray:
        return self._flush(values) if self.ftz else values

    def probe(self, name: str, value) -> None:
        """Keep a sub-step's output under its probe name (specs/kernel-abi.md), only while capturing: the last
        call wins, which is the whole step's (a rejected record's retry runs the sub-steps again first)."""
        if self.probes is not None:
            self.probes[name] = np.array(value, copy=True)

    def record(self, key: str, value) -> None:
        """Keep an intermediate for an explanation's provenance (only while tracing)."""
        if self.trace is not None:
            self.trace.setdefault(key, []).append(np.array(value, copy=True))


REFERENCE = Numerics()
