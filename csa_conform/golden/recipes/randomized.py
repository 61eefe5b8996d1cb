"""Family ``random``: ``numpy.random.default_rng(seed)`` streams at realistic scales.

Values follow the reference corpus: bf16-representable normals (query, kv and
compressor rows with unit spread, gates and APE at 0.5, norms near 1; kv rows,
compressor values and gates and synthesized carries with 4 significant bits,
see ``Values.coarse``), and index data carrying a +2 offset on its first 64
dims so index scores are positive and rarely tie — two records whose index
dots are all <= 0 score exactly 0, a top-k tie the reference rejects (the
``-signed`` cases draw them without it, so that ci sees negative dots). The
shape spec covers both ratios, both ratio-128 cache formats, 5 and 6 ratio-4
outputs, batch, heads, index heads, top-k, a non-default ``scale`` and every
broadcast shape of ``attention_bias`` (in ``ci`` on ratio 4; a handful on
ratio 128).

Weights (APE, norms, sinks) are drawn once per suite seed and ratio, like a
model's parameters, and activations per case: cases of one model then share
their weight arrays, which the golden store keeps once. Synthesized carries
of resumed streams are shared the same way (see ``carry_seed``).
"""

from __future__ import annotations

import itertools
import zlib
from dataclasses import dataclass, replace
from functools import partial
from typing import Callable

import numpy as np

from csa_conform.contract import DENSE_WINDOW
from csa_conform.golden.recipes.stream import (
    HEAD_DIM,
    INDEX_DIM,
    RATIO4_OUTPUTS_5,
    RATIO4_OUTPUTS_6,
    RATIO128_OUTPUTS,
    Recipe,
    StepPlan,
    StreamPlan,
    base_attrs,
    empty_state,
    initial_carry,
    stale_carries,
)
from csa_conform.numerics.bf16 import bf16_round
from csa_conform.numerics.fp4 import quantize_fp4_blocks
from csa_conform.numerics.fp8 import FP8_BLOCK, quantize_fp8_blocks
from csa_conform.numerics.hadamard import hadamard_bf16
from csa_conform.numerics.records import FP8_BLOCKS, decode_fp8_record, pack_fp4_record, pack_fp8_record

FAMILY = "random"
INDEX_OFFSET = 2.0
OFFSET_DIMS = 64
MAX_SINKS = 64
COARSE_BITS = 4


@dataclass(frozen=True)
class StreamSpec:
    """Geometry of a random stream.

    ``chunks`` are the step lengths (prefill first) from position ``start``.
    A stream that starts later begins from a synthesized state (see
    ``synthesized_state``), which reaches far block edges and long kv
    windows without storing the prefill before them. ``windows`` choose Kc
    per step, cycled: "full" (the whole history), "min" (just reaching the
    earliest dense-window position) or an int added to the minimum. ``bias`` is one
    broadcast pattern per step, cycled: flags over the trailing axes of
    [B, N, S, C] (True = full extent, False = 1); () is a scalar bias.

    ``index_offset`` lifts the first 64 dims of index queries and keys so that
    few index heads still score positive (zero scores tie). With many records
    it backfires: the offset dominates the Hadamard spectrum, keys quantize
    alike and nonzero scores tie, so long many-head streams set it to 0. (The
    reference refuses any two equal scores in a row, so random data ties all
    but surely beyond a few hundred records: prod stops at T = 1026.)

    ``stale_carry`` sends a stream from position 0 stale carries of that kv
    (see ``stale_carries``) in batch rows ``stale_from_row`` on instead of
    cleared ones: the contract clears them, so only a kernel that skips the
    clear sees them.
    """

    ratio: int
    chunks: tuple[int, ...]
    batch: int = 1
    heads: int = 1
    cache_format: str = ""
    index_heads: int = 1
    index_topk: int = 2
    outputs: int = 6
    scale: float | None = None
    windows: tuple[str | int, ...] = ("full",)
    bias: tuple[tuple[bool, ...], ...] = ()
    start: int = 0
    index_offset: float = INDEX_OFFSET
    stale_carry: float | None = None
    stale_from_row: int = 0

    def attrs(self) -> dict:
        extra = {} if self.scale is None else {"scale": self.scale}
        if self.ratio == 4:
            extra.update(
                index_num_heads=self.index_heads,
                index_head_dim=INDEX_DIM,
                index_topk=self.index_topk,
            )
        return base_attrs(self.ratio, self.heads, cache_format=self.cache_format or None, **extra)

    def output_names(self) -> tuple[str, ...]:
        if self.ratio == 128:
            return RATIO128_OUTPUTS
        return RATIO4_OUTPUTS_6 if self.outputs == 6 else RATIO4_OUTPUTS_5

    def weight(self) -> int:
        """Rough work of making and storing the case (rows of heads written, records synthesized), for
        starting the heavier cases of a --jobs run first: prod's ratio-4 case weighs twice a ratio-128 one."""
        heads = self.heads + (self.index_heads if self.ratio == 4 else 0)
        return self.batch * (sum(self.chunks) * heads + self.start // self.ratio)

    def starts(self) -> list[int]:
        return list(itertools.accumulate(self.chunks, initial=self.start))[:-1]

    def kv_window(self, step: int, start: int, length: int) -> int:
        total = start + length
        minimum = total - max(0, start + 1 - DENSE_WINDOW)
        window = self.windows[step % len(self.windows)]
        if window == "full":
            return total
        extra = 0 if window == "min" else int(window)
        return min(total, minimum + extra)

    def candidates(self, step: int, start: int, length: int) -> int:
        """C of the step (specs/contract.md, stage 6), which a full-width bias axis must match."""
        total = start + length
        window = self.kv_window(step, start, length)
        dense = min(window, DENSE_WINDOW) if start == 0 else DENSE_WINDOW
        if self.ratio == 4:
            return dense + min(self.index_topk, total // 4)
        return dense + total // 128


class Values:
    """Draws bf16-representable normals from one ``default_rng`` stream."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def normal(self, shape, std: float = 1.0, mean: float = 0.0) -> np.ndarray:
        return bf16_round(self._draw(shape, std, mean))

    def coarse(self, shape, std: float = 1.0, mean: float = 0.0) -> np.ndarray:
        """Normals rounded to ``COARSE_BITS`` significant bits (bf16 keeps 8).

        For the rows a golden file stores by the hundred: kv history,
        compressor values and gates, synthesized carries. Each use multiplies
        a kv or compressor value by a full-precision softmax weight or a bf16
        query, so the sums still round at almost every step, and a gate only
        shifts a score on its way into exp. They compress to two thirds of
        the size of bf16 values. Index rows stay bf16: coarse index keys tie.
        """
        bits = self._draw(shape, std, mean).view(np.uint32)
        drop = np.uint32(24 - COARSE_BITS)
        odd = (bits >> drop) & np.uint32(1)
        rounded = bits + (np.uint32(1) << (drop - np.uint32(1))) - np.uint32(1) + odd  # ties to even
        return (rounded >> drop << drop).view(np.float32)

    def _draw(self, shape, std: float, mean: float) -> np.ndarray:
        draw = self.rng.standard_normal(shape, dtype=np.float32)
        draw *= np.float32(std)  # in place: the same two binary32 operations, no temporaries
        draw += np.float32(mean)
        return draw

    def index_rows(self, shape, offset: float) -> np.ndarray:
        """Index query / compressor rows: the first 64 dims of each 128-wide head or channel offset."""
        rows = self.normal(shape)
        view = rows.reshape(rows.shape[:-1] + (rows.shape[-1] // INDEX_DIM, INDEX_DIM))
        view[..., :OFFSET_DIMS] += np.float32(offset)
        return rows


def _bias_shape(pattern: tuple[bool, ...], full: tuple[int, int, int, int]) -> tuple[int, ...]:
    trailing = full[len(full) - len(pattern) :]
    return tuple(extent if keep else 1 for extent, keep in zip(trailing, pattern))


def fresh_rows(spec: StreamSpec, values: Values, bias: Values, start: int, length: int, step: int) -> dict:
    batch, ratio = spec.batch, spec.ratio
    width = 2 * HEAD_DIM if ratio == 4 else HEAD_DIM
    fresh = {
        "query": values.normal((batch, length, spec.heads, HEAD_DIM)),
        "compressor_kv": values.coarse((batch, length, width)),
        "compressor_gate": values.coarse((batch, length, width), 0.5),
    }
    if ratio == 4:
        fresh.update(
            index_query=values.index_rows((batch, length, spec.index_heads, INDEX_DIM), spec.index_offset),
            index_weight=values.normal((batch, length, spec.index_heads)),
            index_compressor_kv=values.index_rows((batch, length, 2 * INDEX_DIM), spec.index_offset),
            index_compressor_gate=values.normal((batch, length, 2 * INDEX_DIM), 0.5),
        )
    if spec.bias:
        pattern = spec.bias[step % len(spec.bias)]
        full = (batch, spec.heads, length, spec.candidates(step, start, length))
        fresh["attention_bias"] = bias.normal(_bias_shape(pattern, full), 0.5)
    return fresh


def weights(spec: StreamSpec, weights_seed: int) -> dict[str, np.ndarray]:
    """The model's parameters: APE and RMSNorm weights per ratio, one sink logit per head.

    Each comes from its own generator so that every case of a ratio (and the
    first N sinks of any head count) sees the same arrays.
    """
    ratio = spec.ratio
    width = 2 * HEAD_DIM if ratio == 4 else HEAD_DIM
    model = Values(weights_seed + ratio)
    shared = {
        "compressor_ape": model.normal((ratio, width), 0.5),
        "compressor_norm": model.normal((HEAD_DIM,), 0.1, 1.0),
        "head_sink": Values(weights_seed).normal((MAX_SINKS,), 0.3)[: spec.heads],
    }
    if ratio == 4:
        shared.update(
            index_compressor_ape=model.normal((4, 2 * INDEX_DIM), 0.5),
            index_compressor_norm=model.normal((INDEX_DIM,), 0.1, 1.0),
        )
    return shared


def _fp8_records(values: Values, shape: tuple[int, ...]) -> np.ndarray:
    """Hybrid FP8/BF16 records of bf16 normals (what finalization of a normalized record gives)."""
    logical = values.normal(shape + (HEAD_DIM,))
    quantized = FP8_BLOCKS * FP8_BLOCK
    scales, codes, _ = quantize_fp8_blocks(logical[..., :quantized].reshape(shape + (FP8_BLOCKS, FP8_BLOCK)))
    return pack_fp8_record(scales, codes, logical[..., quantized:])


def _fp4_records(values: Values, shape: tuple[int, ...], offset: float) -> np.ndarray:
    """FP4 index keys as finalization makes them: Hadamard of offset index rows, then FP4."""
    rotated = hadamard_bf16(values.index_rows(shape + (INDEX_DIM,), offset))
    scales, packed, _ = quantize_fp4_blocks(rotated.reshape(shape + (INDEX_DIM // 32, 32)))
    return pack_fp4_record(scales, packed)


def filled_carry(values: Values, batch: int, slots: int, width: int, filled) -> np.ndarray:
    """A carry whose ``filled`` slots hold coarse kv rows and gate+APE-like scores."""
    carry = initial_carry(batch, slots, width)
    for slot in filled:
        carry[:, slot, 0] = values.coarse((batch, width))
        carry[:, slot, 1] = values.coarse((batch, width), 0.7)
    return carry


def synthesized_state(spec: StreamSpec, values: Values, carry_values: Values) -> dict[str, np.ndarray]:
    """The past_* inputs of a stream resumed at ``spec.start``.

    start // R valid records (quantized normals) and a carry holding the
    earlier positions of the current block — for ratio 4 also the previous
    block rotated into slots 0..3. The reference never checks that state
    against history, so any valid state is a step a runtime may send.
    The carries come from ``carry_values`` (see ``carry_seed``).
    """
    attrs, batch, start = spec.attrs(), spec.batch, spec.start
    state = empty_state(attrs, batch)
    if start == 0:
        return state if spec.stale_carry is None else stale_carries(state, spec.stale_carry, spec.stale_from_row)
    ratio, records = spec.ratio, start // spec.ratio
    in_block = range(start % ratio)
    packed = _fp8_records(values, (batch, records))
    if attrs["cache_format"] == "f32":
        packed = decode_fp8_record(packed)
    state["past_compressed_kv"] = packed
    if ratio == 128:
        state["past_compression_carry"] = filled_carry(carry_values, batch, 128, HEAD_DIM, in_block)
        return state
    filled = [4 + slot for slot in in_block] + (list(range(4)) if records else [])
    state["past_compression_carry"] = filled_carry(carry_values, batch, 8, 2 * HEAD_DIM, filled)
    state["past_index_key"] = _fp4_records(values, (batch, records), spec.index_offset)
    state["past_index_carry"] = filled_carry(carry_values, batch, 8, 2 * INDEX_DIM, filled)
    return state


def carry_seed(weights_seed: int, spec: StreamSpec) -> int:
    """Synthesized carries are drawn per suite seed, ratio, batch and offset in the block, not
    per case: streams resumed at the same offset of different blocks share the carry, which
    for ratio 128 near a block end is the largest array they hold."""
    key = f"carry r{spec.ratio} b{spec.batch} +{spec.start % spec.ratio}"
    return weights_seed ^ zlib.crc32(key.encode())


def step_plans(spec: StreamSpec, values: Values, bias: Values) -> list[StepPlan]:
    """Each step's fresh rows, drawn in step order (the draw order fixes every golden's bytes)."""
    return [
        StepPlan(
            start=start,
            fresh=fresh_rows(spec, values, bias, start, length, index),
            kv_window=spec.kv_window(index, start, length),
        )
        for index, (start, length) in enumerate(zip(spec.starts(), spec.chunks))
    ]


def random_plan(spec: StreamSpec, seed: int, weights_seed: int) -> StreamPlan:
    """Activations from ``seed``; the bias from its own generator, so that cases differing
    only in their bias pattern share every other array.

    kv rows that no step's current_kv window reaches are zero: a stream
    resumed late would otherwise store a block of history nothing reads.
    """
    values, bias = Values(seed), Values(seed + 1)
    attrs = spec.attrs()
    last = spec.start + sum(spec.chunks)
    history = values.coarse((spec.batch, last, HEAD_DIM))
    steps = step_plans(spec, values, bias)
    history[:, : min(step.total - step.kv_window for step in steps)] = 0.0
    return StreamPlan(
        attrs=attrs,
        output_names=spec.output_names(),
        constants=weights(spec, weights_seed),
        kv_history=history,
        initial_state=synthesized_state(spec, values, Values(carry_seed(weights_seed, spec))),
        steps=steps,
    )


def reset_carry_plan(spec: StreamSpec, seed: int, weights_seed: int) -> StreamPlan:
    """A resumed stream whose carries start reset (its records stay synthesized).

    For cases about something other than pooling (the bias patterns), this
    spares the file 126 filled ratio-128 carry slots per batch row and case.
    """
    plan = random_plan(spec, seed, weights_seed)
    reset = empty_state(plan.attrs, spec.batch)
    plan.initial_state.update({name: reset[name] for name in reset if name.endswith("_carry")})
    return plan


def case_seed(base_seed: int, name: str) -> int:
    """The default_rng seed of a case (or of the weights): stable per (suite seed, name)."""
    return (base_seed << 32) | zlib.crc32(name.encode())


def weights_seed(base_seed: int) -> int:
    return case_seed(base_seed, "weights")


def spec_recipe(
    family: str,
    name: str,
    spec: StreamSpec,
    base_seed: int,
    description: str | None = None,
    plan: Callable[..., StreamPlan] = random_plan,
) -> Recipe:
    """A random-valued recipe built by ``plan(spec, seed, weights_seed)``; top-k ties are redrawn."""
    case_id = f"{family}.{name}"
    build = partial(plan, spec, weights_seed=weights_seed(base_seed))
    return Recipe(case_id, family, case_seed(base_seed, case_id), description or describe(spec), build, True,
                  weight=spec.weight())


def describe(spec: StreamSpec) -> str:
    parts = [f"ratio {spec.ratio}"]
    if spec.ratio == 128:
        parts.append(spec.cache_format or "f32")
    else:
        parts.append(f"{spec.outputs} outputs, I={spec.index_heads}, top-{spec.index_topk}")
    parts.append(f"B={spec.batch} N={spec.heads}")
    parts.append(f"steps from {spec.start}: " + "+".join(str(length) for length in spec.chunks))
    if spec.windows != ("full",):
        parts.append("kv windows " + ", ".join(str(window) for window in spec.windows))
    if spec.scale is not None:
        parts.append(f"scale={spec.scale}")
    if spec.bias:
        parts.append("bias shapes " + ", ".join(bias_name(pattern) for pattern in spec.bias))
    if spec.ratio == 4 and spec.index_offset != INDEX_OFFSET:
        parts.append(f"index offset {spec.index_offset:g}")
    if spec.stale_carry is not None:
        rows = f" in batch rows {spec.stale_from_row}.." if spec.stale_from_row else ""
        parts.append(f"stale carries at position 0{rows} (kv {spec.stale_carry:g}, score 0), which the contract clears")
    return "; ".join(parts)


def bias_patterns(rank: int) -> tuple[tuple[bool, ...], ...]:
    """Every broadcast pattern of a rank-r bias (each axis 1 or full)."""
    return tuple(itertools.product((False, True), repeat=rank))


def bias_name(pattern: tuple[bool, ...]) -> str:
    """B1SC-style name of a bias pattern ("scalar" for rank 0)."""
    axes = "BNSC"[4 - len(pattern) :]
    return "".join(axis if keep else "1" for axis, keep in zip(axes, pattern)) or "scalar"


def _ci_specs() -> dict[str, StreamSpec]:
    """Each feature at the fewest tokens, heads and rows that show it.

    Top-k must choose among more records than k to mean anything, so the
    small-k cases resume past two (k=1) and four (k=3) records instead of
    prefilling them. Decodes stream through ``boundaries``; here one case per
    ratio adds a decode (batch 2), and ``full`` streams every case longer.
    The cases from position 0 start from stale carries, so that a kernel
    that skips the clear there diverges.
    """
    return {
        "r128-f32-b2n2": StreamSpec(128, (3, 1), batch=2, heads=2, cache_format="f32", stale_carry=1.0),
        "r128-fp8-n3-scale": StreamSpec(
            128, (2,), heads=3, cache_format="fp8_e4m3_block64", scale=0.0625, stale_carry=1.0
        ),
        "r4-5out-i4-k3": StreamSpec(4, (5,), index_heads=4, index_topk=3, outputs=5, stale_carry=1.0),
        "r4-n4-i3-k1": StreamSpec(4, (2,), heads=4, index_heads=3, index_topk=1, start=8),
        "r4-b2n2-i2-k512": StreamSpec(4, (3, 1), batch=2, heads=2, index_heads=2, index_topk=512),
        "r4-n3-i1-k3-scale": StreamSpec(4, (2,), heads=3, index_heads=1, index_topk=3, scale=0.3, start=16),
    }


def _signed_specs() -> dict[str, StreamSpec]:
    """Index rows without the offset, as prod draws them: about half of the index dots are negative, so
    only these cases see the scorer's ReLU (relu(dot) * w; with the offset every dot in ci is positive).

    One decode token over five records at three index widths, so that more than one case shows the
    ReLU; with several index heads a zero-score tie stays rare (redrawn). The cases share their seed
    and everything but the index rows, their carries start reset (``reset_carry_plan``): they are about
    the scores, and cost the file little more than their index arrays."""
    return {f"r4-i{heads}-k{topk}-signed": StreamSpec(4, (1,), index_heads=heads, index_topk=topk, start=20,
                                                      index_offset=0.0)
            for heads, topk in ((2, 2), (4, 3), (8, 4))}


# Ratio-128 bias patterns in ci: all broadcast, all full, and two complementary mixes, so
# that each of the attention kernel's four broadcast flags is seen set and clear.
CI_R128_BIAS = ("1111", "B1S1", "1N1C", "BNSC")


def _bias_specs(every_pattern_on_both: bool) -> dict[str, StreamSpec]:
    """Broadcast patterns: one 2-token step with B = N = 2 per pattern.

    The step resumes where compressed candidates exist (ratio 4 at 6, two
    records; ratio 128 at 126, whose block end emits one), so the bias covers
    dense and compressed candidate columns alike; the carries start reset.

    A kernel sees a lower-rank bias as rank 4 with leading 1s, so all 31
    patterns run on ratio 4 and, in ``ci``, a handful of rank-4 patterns on
    ratio 128 (``CI_R128_BIAS``): its attention takes the same four
    broadcast flags, and each of its cases stores a 128-row kv window and a
    full Y. ``full`` runs every pattern on both. The cases share their seed,
    so everything but the bias, the attention scores and Y is the same array
    in all of them.
    """
    specs = {}
    for rank in range(5):
        for pattern in bias_patterns(rank):
            name = bias_name(pattern)
            specs[f"r4-bias-{name}"] = bias_spec(4, pattern)
            if every_pattern_on_both or name in CI_R128_BIAS:
                specs[f"r128-bias-{name}"] = bias_spec(128, pattern)
    return specs


def bias_spec(ratio: int, pattern: tuple[bool, ...]) -> StreamSpec:
    """The 2-token step of the bias cases (see ``_bias_specs``), played by ``reset_carry_plan``."""
    if ratio == 4:
        return StreamSpec(4, (2,), batch=2, heads=2, index_heads=2, index_topk=2, bias=(pattern,), start=6)
    return StreamSpec(
        128, (2,), batch=2, heads=2, cache_format="fp8_e4m3_block64", bias=(pattern,), start=126
    )


def bias_seed(base_seed: int, ratio: int) -> int:
    """The seed every bias case of a ratio shares."""
    return case_seed(base_seed, f"{FAMILY}.bias-r{ratio}")


def _full_specs() -> dict[str, StreamSpec]:
    return {
        "r128-f32-b2n4-long": StreamSpec(
            128, (300, 1, 1, 3), batch=2, heads=4, cache_format="f32", windows=(5,)
        ),
        "r128-fp8-b2n4-long": StreamSpec(
            128, (260, 1, 1, 2), batch=2, heads=4, cache_format="fp8_e4m3_block64", scale=0.03
        ),
        "r4-b2n4-i4-k16": StreamSpec(
            4, (200, 1, 1, 4), batch=2, heads=4, index_heads=4, index_topk=16, windows=("min",)
        ),
        "r4-5out-n8-i8-k64": StreamSpec(4, (300, 1, 2), heads=8, index_heads=8, index_topk=64, outputs=5),
        "r4-b2-i2-k512-scale": StreamSpec(
            4, (160, 1, 1), batch=2, heads=2, index_heads=2, index_topk=512, scale=0.125
        ),
        "r4-n4-i3-k1-from-0": StreamSpec(4, (9, 1, 1), heads=4, index_heads=3, index_topk=1),
        "r4-n3-i2-k3-scale-from-0": StreamSpec(4, (17, 1), heads=3, index_heads=2, index_topk=3, scale=0.3),
        "r4-5out-b2-i4-k3": StreamSpec(4, (8, 1), batch=2, index_heads=4, index_topk=3, outputs=5),
        "r4-i1-k2": StreamSpec(4, (6, 1, 1), index_heads=1, index_topk=2),
    }


def _prod_specs() -> dict[str, StreamSpec]:
    minimal = ("min",)
    production_index = dict(heads=64, index_heads=64, index_topk=512, windows=minimal, index_offset=0.0)
    return {
        "r4-n64-i64-k512-s1024": StreamSpec(4, (1024, 1, 1), **production_index),
        "r128-fp8-n64-s1024": StreamSpec(
            128, (1024, 1, 1), heads=64, cache_format="fp8_e4m3_block64", windows=minimal
        ),
        "r128-f32-n64-s1024": StreamSpec(128, (1024, 1, 1), heads=64, cache_format="f32", windows=minimal),
    }


def recipes(suite: str, seed: int) -> list[Recipe]:
    """Random cases of a suite; ``full`` adds two more seeds of the ci shapes and longer streams."""
    if suite == "prod":
        return [spec_recipe(FAMILY, f"prod-{name}", spec, seed) for name, spec in _prod_specs().items()]
    cases = [spec_recipe(FAMILY, name, spec, seed) for name, spec in _ci_specs().items()]
    twin = replace(_ci_specs()["r128-f32-b2n2"], stale_from_row=1)
    recipe = spec_recipe(FAMILY, "r128-f32-b2n2-stale-row-1", twin, seed)
    cases.append(replace(recipe, seed=case_seed(seed, f"{FAMILY}.r128-f32-b2n2")))
    for name, spec in _signed_specs().items():
        recipe = spec_recipe(FAMILY, name, spec, seed, plan=reset_carry_plan)
        cases.append(replace(recipe, seed=case_seed(seed, f"{FAMILY}.signed")))
    for name, spec in _bias_specs(suite == "full").items():
        recipe = spec_recipe(FAMILY, name, spec, seed, plan=reset_carry_plan)
        cases.append(replace(recipe, seed=bias_seed(seed, spec.ratio)))
    if suite == "full":
        for replica in (1, 2):
            cases += [
                spec_recipe(FAMILY, f"{name}-x{replica}", spec, seed + replica)
                for name, spec in _ci_specs().items()
            ]
        cases += [spec_recipe(FAMILY, name, spec, seed) for name, spec in _full_specs().items()]
    return cases
