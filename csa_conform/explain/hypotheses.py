"""The numeric causes `explain` tries, as numerics variants of the oracle.

A hypothesis swaps one ingredient of the reference's arithmetic: one libm
function, correctly rounded ((float)f((double)x) with the host's double
function), or the device's own: CUDA's binary32 function, or its double
function rounded once (what a kernel writing `(float)exp((double)x)` gets),
both evaluated on the GPU on the same arguments; fused multiply-adds in the reductions
(acc = fma(a, b, acc) in the same order) or in the a*b±c*d pairs of the
compressed RoPE (every pair, or the sums only); flush-to-zero of subnormals; the FP8/FP4 block-scale
exponent from the device's log2f; a bf16 rounding convention other than ties to even (ties away from
zero, truncation); index scoring's head weight scale 1/sqrt(d)/sqrt(I) rounded as one product or one
folded square root, or ported without its 1/sqrt(I) or with I for sqrt(I); attention's softmax weights
multiplied by the rounded reciprocal of their denominator; expf as exp2f(x·log2 e) (a fast-math exp);
as attention's kernel may recompute its P·V weights after the denominator, each expf variant for those
weights alone; attention's logit dots carried in binary64; and its value sum accumulated as
flash-attention kernels do (divided by Z once at the end, or carried in binary64). Each stage is tried
only with the ingredients it contains (its ``libm`` and ``fusions`` in csa_conform.spec).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from csa_conform.explain import exact_fma
from csa_conform.explain.patterns.substeps import SUB_STEPS
from csa_conform.explain.rounded_libm import correctly_rounded
from csa_conform.numerics.variant import (
    ACCUMULATE,
    GLIBC,
    LOGIT_ACCUMULATE,
    PAIRS_FIRST,
    PAIRS_SECOND,
    SUMS_FIRST,
    SUMS_SECOND,
    VALUE_ACCUMULATE,
    Numerics,
    Tally,
)
from csa_conform.oracle.engine import numba_available
from csa_conform.oracle.index_scoring import SCALE_FOLDINGS
from csa_conform.oracle.pooling import RMS_NORM_PORTS
from csa_conform.spec import BY_NAME, FLOAT_STAGES

LOG2_E = np.float32(1.4426950408889634)  # 1.44269504f: log2 e as a binary32 literal
WEIGHTS_ONLY = "weights-"  # key prefix of an expf variant for attention's P·V weights alone
# attention's outer-product sums in one compiled call each where numba imports (exact_fma)
COMPILED_SUMS = {"outer_accumulation": exact_fma.outer_accumulate, "wide_accumulation": exact_fma.wide_accumulate}
BINARY64_VALUES = "values:binary64"  # key prefix of attention's value sum carried in binary64
BINARY64_TILES = (0, 64, 128, 256)  # candidate slots per binary32 rounding of a binary64 value sum (0: once)
# Stages that round to bf16, and the rounding conventions a port may use instead of ties-to-even.
BF16_STAGES = ("compression_update", "index_key_update", "index_query_finalize")
BF16_CONVENTIONS = {"ties-away": "bf16 rounding ties away from zero (not to even)",
                    "truncate": "bf16 by truncation (rounding toward zero)"}

FUSION_NAMES = {
    ACCUMULATE: "FMA accumulation (acc = fma(a, b, acc), same order)",
    VALUE_ACCUMULATE: "FMA accumulation in the P·V value sum alone (acc = fma(p, v, acc), same order; the logit "
                      "dots rounded apart)",
    LOGIT_ACCUMULATE: "FMA accumulation in the logit dots alone (acc = fma(q, k, acc), same order; the P·V value "
                      "sum rounded apart)",
    PAIRS_FIRST: "a*b±c*d contracted as fma(a, b, ±c*d)",
    PAIRS_SECOND: "a*b±c*d contracted as fma(±c, d, a*b)",
    SUMS_FIRST: "a*b+c*d (sums only) contracted as fma(a, b, c*d)",
    SUMS_SECOND: "a*b+c*d (sums only) contracted as fma(c, d, a*b)",
}


@dataclass(frozen=True)
class Hypothesis:
    """A named ingredient swap; ``numerics(tallies)`` is the variant that applies it."""

    key: str
    name: str
    libm: tuple[tuple[str, Callable], ...] = ()
    block_scale: Callable | None = None
    fused: frozenset[str] = frozenset()
    ftz: bool = False
    bf16: str | None = None
    rope_shift: int = 0
    rope_split_halves: bool = False
    code_ties_away: bool = False
    sub_step: str = ""  # for a structural hypothesis: the sub-step of the stage it changes
    scale_folding: str | None = None  # index scoring's head weight scale rounded another way
    hadamard: str | None = None  # the Hadamard butterfly ported another way
    softmax_reciprocal: bool = False  # the softmax weights times the rounded 1/Z instead of over Z
    weights_exp: Callable | None = None  # attention's P·V weights' exp, apart from the denominator's
    port: tuple[tuple[str, object], ...] = ()  # Numerics fields of a step ported another way (field, value)
    # for a hypothesis about how the kernel reads its data: (inputs, upstream) -> what the kernel read instead
    reading: Callable | None = None

    def numerics(self, tallies: dict[str, Tally] | None = None, trace: dict | None = None) -> Numerics:
        numerics = Numerics(dict(self.libm), self.block_scale, self.fused, self.ftz, tallies, trace, self.bf16,
                            self.rope_shift, self.rope_split_halves, self.code_ties_away, exact_fma.fmaf,
                            self.scale_folding, self.hadamard, self.softmax_reciprocal, self.weights_exp,
                            fused_accumulation=exact_fma.fused_accumulate,
                            **(COMPILED_SUMS if numba_available() else {}))
        return replace(numerics, **dict(self.port)) if self.port else numerics

    def combine(self, other: Hypothesis) -> Hypothesis:
        return Hypothesis(f"{self.key}+{other.key}", f"{self.name} + {other.name}", self.libm + other.libm,
                          self.block_scale or other.block_scale, self.fused | other.fused, self.ftz or other.ftz,
                          self.bf16 or other.bf16,
                          softmax_reciprocal=self.softmax_reciprocal or other.softmax_reciprocal,
                          weights_exp=self.weights_exp or other.weights_exp, port=self.port + other.port)


def stage_hypotheses(stage: str, device_libm: Callable[[str], Callable] | None) -> list[Hypothesis]:
    """Every single-ingredient hypothesis for a stage (device-libm ones only with a device)."""
    found = []
    for name in BY_NAME[stage].libm:
        where = "E8M0 block-scale log2f" if name == "log2f" else name
        found.append(Hypothesis(f"{name}:correctly-rounded", f"{where} correctly rounded",
                                libm=((name, correctly_rounded(name)),)))
        if device_libm is not None:
            double = f"(float){name[:-1]}((double)x) on the device"
            if name == "log2f":
                found.append(Hypothesis("log2f:device", "E8M0 block-scale exponent from the device's log2f",
                                        block_scale=device_libm(name)))
                found.append(Hypothesis("log2f:device-double", f"E8M0 block-scale exponent from {double}",
                                        block_scale=device_libm(name + "-double")))
            else:
                found.append(Hypothesis(f"{name}:device", f"{name} from the device's libm",
                                        libm=((name, device_libm(name)),)))
                found.append(Hypothesis(f"{name}:device-double", f"{name} as {double}",
                                        libm=((name, device_libm(name + "-double")),)))
        if name == "expf":
            found += _fast_exps(device_libm)
    if device_libm is not None and {"sinf", "cosf"} <= set(BY_NAME[stage].libm):
        # RoPE's angle: a kernel takes its sine and cosine from one call (sincosf) or one library, so the pair is
        # one ingredient; each alone may fit one step and miss another where only the other one differs
        found.append(Hypothesis("sincosf:device", "sinf and cosf from the device's libm (RoPE's sincosf)",
                                libm=(("sinf", device_libm("sinf")), ("cosf", device_libm("cosf")))))
    if stage == "sparse_sink_softmax_attention":  # its kernel may recompute the weights after the denominator
        found += [Hypothesis(f"{WEIGHTS_ONLY}{h.key}", f"the P·V weights' {h.name} (the denominator's expf the "
                             "reference's)", weights_exp=h.libm[0][1])
                  for h in found if h.libm and h.libm[0][0] == "expf"]
    for fused in BY_NAME[stage].fusions:
        found.append(Hypothesis(f"fma:{fused}", FUSION_NAMES[fused], fused=frozenset({fused})))
    if stage in FLOAT_STAGES:
        found.append(Hypothesis("ftz", "flush-to-zero of subnormal inputs and results", ftz=True))
    if stage == "index_scoring":
        for folding, how in SCALE_FOLDINGS.items():
            found.append(Hypothesis(f"scale:{folding}", f"the head weight scale 1/sqrt(d)/sqrt(I) computed as {how}",
                                    scale_folding=folding))
    if stage == "sparse_sink_softmax_attention":
        found.append(Hypothesis("softmax:reciprocal", "the softmax weights multiplied by the rounded reciprocal 1/Z "
                                "of their denominator instead of divided by Z", softmax_reciprocal=True))
        found.append(Hypothesis("logits:binary64", "the logit dots q·k carried in binary64 (exact products) and "
                                "rounded to binary32 once, before the scale", port=(("binary64_logits", True),)))
        found += value_sums()
    return found


def value_sums() -> list[Hypothesis]:
    """Attention's value sum accumulated as flash-attention kernels do: normalized once at the end (sum
    exp(s - m)·v, then / Z per output element), or carried in binary64 and rounded to binary32 once, or once
    per tile of candidate slots (BINARY64_TILES: one ingredient, the tile a variant of it)."""
    found = [Hypothesis("values:deferred-normalization", "deferred normalization: the value sum taken over the "
                        "weights exp(s - m) and divided by the denominator Z once per output element (not a sum of "
                        "p = exp(s - m) / Z times the value)", port=(("deferred_normalization", True),))]
    for tile in BINARY64_TILES:
        when = f"once per tile of {tile} candidate slots" if tile else "once"
        found.append(Hypothesis(f"{BINARY64_VALUES}{f'-tile{tile}' if tile else ''}", "the P·V value sum carried in "
                                f"binary64 (exact products) and rounded to binary32 {when}",
                                port=(("binary64_values", tile),)))
    return found


def _via_exp2(exp2: Callable) -> Callable:
    """expf as a fast-math port writes it: exp2f(x * log2 e), the product rounded to binary32 first."""
    def evaluate(x):
        with np.errstate(over="ignore", invalid="ignore"):
            return exp2(np.asarray(x, dtype=np.float32) * LOG2_E)
    return evaluate


def _fast_exps(device_libm: Callable[[str], Callable] | None) -> list[Hypothesis]:
    """expf as exp2f(x·log2 e): glibc's exp2f (the host's and the reference platform's), and the device's."""
    found = [Hypothesis("expf:exp2f", "expf as exp2f(x·log2 e) with glibc's exp2f (a fast-math exp)",
                        libm=(("expf", _via_exp2(GLIBC["exp2f"])),))]
    if device_libm is not None:
        found.append(Hypothesis("expf:exp2f-device", "expf as exp2f(x·log2 e) with the device's exp2f (a fast-math "
                                "exp)", libm=(("expf", _via_exp2(device_libm("exp2f"))),)))
    return found


def structural_hypotheses(stage: str, ratio: int) -> list[Hypothesis]:
    """One sub-step of a multi-step stage done another way: the pool leaving its first or last candidate out
    of the sums or (ratio 4) splitting the two halves one slot off, RMSNorm over the square sum or without
    its weight, a bf16 rounding convention, FP8/FP4 codes
    rounding ties away from zero, FP8 codes truncated, RoPE at the wrong position (the block's last position
    for a record, one off) or with the split-halves pair layout, the Hadamard butterfly's difference reversed
    or the rotation left out; and one step of a single-step stage done another way: index scoring's causal
    count one off, selection padding with record 0, ranking the whole cache or ranking by a sort key that orders
    negative scores another way, the dense window one slot longer or leaving the query's own position out, the
    dense window or (ratio 128) the causal records taken from the step's first position for every query, the
    sink logit in attention's running max."""
    found = []
    if stage in ("compression_update", "index_key_update"):
        for skipped in ("first", "last"):
            found.append(Hypothesis(f"pool:{skipped}-left-out", f"the pooled sums leaving out the {skipped} candidate "
                                    "slot (the max still over every slot)", sub_step="pool",
                                    port=(("pool_skipped", skipped),)))
        if ratio == 4:
            for shift in (-1, 1):
                slot = 4 + min(shift, 0)
                half = "second (this block's)" if shift < 0 else "first (the previous block's)"
                found.append(Hypothesis(f"pool:boundary{shift:+d}", f"the overlapping pool reading slot {slot} from "
                                        f"the {half} half of the width (the halves split at slot {4 + shift}, not 4)",
                                        sub_step="pool", port=(("overlap_boundary", shift),)))
    if stage in ("compression_update", "index_key_update"):
        for port, name in RMS_NORM_PORTS.items():
            found.append(Hypothesis(f"rms:{port}", name, sub_step="RMSNorm", port=(("rms_norm", port),)))
    if stage in BF16_STAGES:
        for convention, name in BF16_CONVENTIONS.items():
            found.append(Hypothesis(f"bf16:{convention}", name, bf16=convention, sub_step="bf16"))
    if stage in SUB_STEPS:
        quantization = SUB_STEPS[stage][-1]
        found.append(Hypothesis("codes:ties-away", f"{quantization[:3]} codes rounding ties away from zero (not to "
                                "the even code)", code_ties_away=True, sub_step=quantization))
    if stage == "compression_update":
        found.append(Hypothesis("codes:truncate", "FP8 codes of normal values truncated toward zero (not rounded "
                                "to nearest even)", sub_step=SUB_STEPS[stage][-1], port=(("codes_truncated", True),)))
    if stage in SUB_STEPS:
        shifts = {1: "RoPE at the next position (position+1)", -1: "RoPE at the previous position (position-1)"}
        if stage != "index_query_finalize":
            shifts = {ratio - 1: "RoPE at the block's last position instead of its first", **shifts}
        for shift, name in shifts.items():
            found.append(Hypothesis(f"rope:position{shift:+d}", name, rope_shift=shift, sub_step="RoPE"))
        found.append(Hypothesis("rope:split-halves", "RoPE pairs (d, d+rope_dim/2) instead of (2i, 2i+1)",
                                rope_split_halves=True, sub_step="RoPE"))
    if "Hadamard" in SUB_STEPS.get(stage, ()):
        found.append(Hypothesis("hadamard:difference-reversed", "the Hadamard butterfly writing b - a for a - b",
                                hadamard="difference-reversed", sub_step="Hadamard"))
        found.append(Hypothesis("hadamard:skipped", "the Hadamard rotation left out (the quantizer takes the RoPE "
                                "output)", hadamard="skipped", sub_step="Hadamard"))
    if stage == "index_scoring":
        for shift, count in ((-1, "position/4"), (1, "(position+2)/4")):
            found.append(Hypothesis(f"causal:{shift:+d}", f"the causal record count (position+1)/4 computed as {count} "
                                    f"(one record {'short' if shift < 0 else 'long'})",
                                    port=(("causal_shift", shift),)))
    if stage == "selection":
        found.append(Hypothesis("selection:pad-0", "the slots past a row's causal records padded with record 0 "
                                "instead of -1", port=(("selection_pad", 0),)))
        found.append(Hypothesis("selection:over-cache", "the selection ranking every record of the cache, not the "
                                "query's causal ones: the non-causal records (score -inf, lowest id first) fill the "
                                "slots past a row's causal records instead of -1",
                                port=(("selection_over_cache", True),)))
        found.append(Hypothesis("selection:sign-flipped-key", "the top-k sort key flipping only the sign bit of each "
                                "score (negative scores ranked in reverse: the most negative first among them)",
                                port=(("selection_key", "sign-flipped"),)))
        found.append(Hypothesis("selection:raw-bits-key", "the top-k sort key the score's bits as they are (negative "
                                "scores ranked above every positive one, the most negative first)",
                                port=(("selection_key", "raw-bits"),)))
    if stage == "candidate_assembly":
        found.append(Hypothesis("dense:one-longer", "the dense window one slot longer than the contract's (the record "
                                "slots one place up, the last dropped)", port=(("dense_extra", 1),)))
        found.append(Hypothesis("dense:own-position-left-out", "the dense window's causal bound strict (position < "
                                "the query's, not <=): each query's own position left out",
                                port=(("dense_strict", True),)))
        found.append(Hypothesis("dense:from-step-start", "every query's dense window started from the step's first "
                                "position instead of its own",
                                port=(("from_step_start", frozenset({"dense window"})),)))
        if ratio == 128:
            found.append(Hypothesis("records:from-step-start", "every query's causal records counted from the step's "
                                    "first position instead of its own",
                                    port=(("from_step_start", frozenset({"causal records"})),)))
    if stage == "sparse_sink_softmax_attention":
        found.append(Hypothesis("softmax:sink-in-max", "the sink logit taken into the softmax's running max",
                                port=(("sink_in_max", True),)))
    return found
