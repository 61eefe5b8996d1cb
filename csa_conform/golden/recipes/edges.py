"""Family ``edges``: the shapes other families reach once, each reached by several cases.

A porting bug that shows at one shape slips past a suite that lacks it: the
index-head weight 1/sqrt(d)/sqrt(I) folded into 1/sqrt(d*I) rounds
differently at I = 3 only (of 1..8), a sink that joins the softmax maximum
changes only rows whose sink is above every score, a dense window off by one
shows only past position 128, a batch-row offset only at B > 1. So these
random streams put N and I in {1, 2, 3, 5, 8} with B = 1 and B > 1 through
both ratios and both ratio-128 caches, give alternate heads a sink far above
(+30) and far below (-30) every score, resume past 128 with the shortest and
the next kv windows, and rotate ratio-128 records whose block starts at
2^16 and at 2^17 (the sinf/cosf large-argument reduction at those
exponents; the step's queries sit past them) from a synthesized long state, and end the second
ratio-128 block inside a B = 2 step, whose first query then reads fewer records than the cache
holds (attention that strides the cache's batch rows by that count instead of the capacity
diverges there only). Carries start reset where
the case is about something other than pooling, which keeps the file small.
Three streams (both ratios, both ratio-128 caches) move the compressor gates of a third of
the pooled dimensions far above (+96) and another third far below (-112) every other score:
the pooling softmax must subtract its maximum (exp(96) overflows binary32, exp(-112)
underflows to 0) from a maximum that starts at -inf, not 0.
Four top-1 decodes score every record they read from crafted index keys: the first two apart in
the last 8 bits of the selection's key only, where a radix select that stops a digit early picks
the wrong one. Three sit at position 34, whose index-query RoPE pair 10 turns just above pi/4 (a
sinf/cosf without its argument reduction there moves a whole FP4 block of the transformed query);
the fourth, B = 2 at 28, starts the past cache's second batch row at an odd byte (7 * 583), where
a copy of 8-byte words faults on a GPU.

The rounding classes quant-edge plants once per ratio get three cases each
here (tests/kernels_mutants/test_rounding_classes.py counts them): its
crafted block end (the record is the norm weights) with bf16 ties in both
directions among the weights of both caches, -0 index queries and a query
head under the FP4 amax floor, an index-key design whose 32-blocks are 6, 0,
2 and 0 (amax exactly 6, all-zero blocks), -0 key weights, index rows
whose bf16 ties pool back to 2^10, and three ratio-128 block ends at blocks
whose first position rotates a chosen RoPE tail onto bf16 ties both ways.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache, partial

import numpy as np

from csa_conform.errors import FixtureError
from csa_conform.golden.recipes.long_context import MIN_WINDOW, long_plan
from csa_conform.golden.recipes.quant_edge import UNIT_ROW, crafted_plan, walsh_vector
from csa_conform.golden.recipes.randomized import StreamSpec, case_seed, describe, reset_carry_plan, spec_recipe
from csa_conform.golden.recipes.stream import INDEX_DIM, Recipe, StreamPlan, empty_state
from csa_conform.numerics.fp4 import pack_nibbles, quantize_fp4_blocks, unpack_nibbles
from csa_conform.numerics.index_query import finalize_index_query
from csa_conform.numerics.records import decode_fp4_record, pack_fp4_record
from csa_conform.numerics.rope import rope_frequencies
from csa_conform.numerics.variant import REFERENCE
from csa_conform.oracle.index_scoring import head_weight_scale

FAMILY = "edges"
FP8 = "fp8_e4m3_block64"
SINK_SHIFT = np.float32(30.0)
T16, T17 = 1 << 16, 1 << 17


def sink_plan(spec: StreamSpec, seed: int, weights_seed: int) -> StreamPlan:
    """A reset-carry random stream whose even heads' sinks sit far above every score, odd heads' far below."""
    plan = reset_carry_plan(spec, seed, weights_seed)
    shifts = np.where(np.arange(spec.heads) % 2 == 0, SINK_SHIFT, -SINK_SHIFT).astype(np.float32)
    plan.constants["head_sink"] = (plan.constants["head_sink"] + shifts).astype(np.float32)
    return plan


def far_plan(spec: StreamSpec, seed: int, weights_seed: int) -> StreamPlan:
    """A long-state stream (synthesized records up to ``spec.start``) whose carry starts reset."""
    plan = long_plan(spec, seed, weights_seed)
    reset = empty_state(plan.attrs, spec.batch)
    plan.initial_state.update({name: reset[name] for name in reset if name.endswith("_carry")})
    return plan


def quiet_history_plan(spec: StreamSpec, seed: int, weights_seed: int) -> StreamPlan:
    """A reset-carry random stream whose kv rows before the step are zero: a case about the records
    each query reads, which would otherwise store a 128-row random dense window per batch row."""
    plan = reset_carry_plan(spec, seed, weights_seed)
    plan.kv_history[:, : spec.start] = 0.0
    return plan


FAR_GATES = np.array([96.0, -112.0, 0.0], dtype=np.float32)


def far_gate_plan(spec: StreamSpec, seed: int, weights_seed: int) -> StreamPlan:
    """A reset-carry random stream whose gates of pooled dimension d move by FAR_GATES[d % 3]; a ratio-4
    gate row holds two channels (the overlap's and the block's), so d counts within its channel."""
    plan = reset_carry_plan(spec, seed, weights_seed)
    for step in plan.steps:
        for name in ("compressor_gate", "index_compressor_gate"):
            if name in step.fresh:
                gate = step.fresh[name]
                channel = gate.shape[-1] // 2 if spec.ratio == 4 else gate.shape[-1]
                step.fresh[name] = gate + FAR_GATES[np.arange(gate.shape[-1]) % channel % 3]
    return plan


# bf16 ties: 1 + 2^-8 rounds down to the even 1, 1 + 3 * 2^-8 up to the even 1 + 2^-6.
TIE_DOWN, TIE_UP = np.float32(1 + 2.0**-8), np.float32(1 + 3 * 2.0**-8)
BF16_TIES = np.array([TIE_DOWN, -TIE_DOWN, TIE_UP, -TIE_UP], dtype=np.float32)
# Walsh components 0, 32, 64, 96: the Hadamard output's four 32-blocks are 6, 0, 2 and 0.
KEY_DESIGN = {0: 2.0, 32: 2.0, 64: 1.0, 96: 1.0}
TIED_KEY_DIM = 3  # a dim whose key weight is -0: its tie up leaves the record as designed
TINY = np.float32(2.0**-128)  # a query head this small has every FP4 block under the amax floor 6 * 2^-126


def _negative_zeros(values: np.ndarray) -> np.ndarray:
    return np.where(values == 0, np.float32(-0.0), values).astype(np.float32)


def tie_plan(spec: StreamSpec, seed: int, weights_seed: int) -> StreamPlan:
    """quant-edge's crafted block end with bf16 ties: the last four weights of FP8 block 0 and of the
    RoPE tail are ties (x * inv_rms is exactly 1 there, so the record's bf16 rounds each weight); at
    ratio 4 the index key weights are KEY_DESIGN with -0 elsewhere, the pooled index row is
    2^10 (1 + 2^-8) (ties down to 2^10) but one dim ties up, the index queries' zeros are -0 and the
    last index head's designs are scaled by 2^-128."""
    plan = crafted_plan(spec, seed, weights_seed)
    norm = plan.constants["compressor_norm"]
    norm[60:64] = BF16_TIES
    norm[-4:] = BF16_TIES
    if spec.ratio == 4:
        plan.constants["index_compressor_norm"] = _negative_zeros(walsh_vector(KEY_DESIGN))
        fresh = plan.steps[0].fresh
        rows = np.full_like(fresh["index_compressor_kv"], UNIT_ROW * TIE_DOWN)
        width = rows.shape[-1] // 2
        rows[..., [TIED_KEY_DIM, width + TIED_KEY_DIM]] = UNIT_ROW * TIE_UP
        fresh["index_compressor_kv"] = rows
        queries = _negative_zeros(fresh["index_query"])
        queries[:, :, -1] *= TINY
        fresh["index_query"] = queries
    return plan


# bf16-exact (real, imag) pairs a RoPE tail may hold; rotated, some pair lands on a bf16 tie.
TAIL_VALUES = np.array([0, 1, -1, 1.5, -1.5, 2, -2, 3, -3, 0.75, -0.75, 1.25, -1.25, 1.75, -1.75, 2.5, -2.5,
                        0.5, -0.5, 3.5, -3.5], dtype=np.float32)
ROPE_DIM = 64
ROPE_TIE_SEARCH = 400  # blocks searched; the first three with both ties are blocks 180, 185 and 214


def _rotated(position: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For every (real, imag) of TAIL_VALUES^2 and pair j: both binary32 outputs of the rotation at
    ``position`` (real*cos - imag*sin, real*sin + imag*cos, each product rounded), and the pairs."""
    real, imag = (axis.reshape(-1, 1) for axis in np.meshgrid(TAIL_VALUES, TAIL_VALUES, indexing="ij"))
    angle = np.float32(position) * rope_frequencies(ROPE_DIM)
    cos, sin = REFERENCE.cosf(angle), REFERENCE.sinf(angle)
    first = (real * cos).astype(np.float32) - (imag * sin).astype(np.float32)
    second = (real * sin).astype(np.float32) + (imag * cos).astype(np.float32)
    return np.stack([first, second]), real[:, 0], imag[:, 0]


def rope_tie_tail(position: int) -> np.ndarray | None:
    """A RoPE tail (bf16 values) whose rotation at ``position`` holds a bf16 tie to even down in one
    pair and a tie up in another (the other pairs 1, 0); None when TAIL_VALUES give none there."""
    outputs, real, imag = _rotated(position)
    bits = outputs.view(np.uint32)
    tie = (bits & np.uint32(0xFFFF)) == np.uint32(0x8000)
    odd = ((bits >> np.uint32(16)) & np.uint32(1)).astype(bool)
    down = {int(pair): int(combo) for _, combo, pair in zip(*np.nonzero(tie & ~odd))}
    up = {int(pair): int(combo) for _, combo, pair in zip(*np.nonzero(tie & odd))}
    choice = next(((a, b) for a in down for b in up if a != b), None)
    if choice is None:
        return None
    tail = np.tile(np.array([1.0, 0.0], dtype=np.float32), ROPE_DIM // 2)
    for pair, combo in ((choice[0], down[choice[0]]), (choice[1], up[choice[1]])):
        tail[2 * pair], tail[2 * pair + 1] = real[combo], imag[combo]
    return tail


@lru_cache(maxsize=None)
def rope_tie_blocks(ratio: int, count: int) -> tuple[int, ...]:
    """The first ``count`` blocks whose start position has a rope_tie_tail."""
    blocks = tuple(block for block in range(1, ROPE_TIE_SEARCH) if rope_tie_tail(block * ratio) is not None)
    return blocks[:count]


def rope_tie_plan(spec: StreamSpec, seed: int, weights_seed: int) -> StreamPlan:
    """quant-edge's crafted block end at a later block: zero past records, the kv history cut to
    the windows, and a RoPE tail whose rotation at the block's first position rounds a tie to bf16
    both ways."""
    plan = crafted_plan(spec, seed, weights_seed)
    block = spec.start // spec.ratio
    cache = plan.initial_state["past_compressed_kv"]
    plan.initial_state["past_compressed_kv"] = np.zeros((spec.batch, block, cache.shape[-1]), dtype=cache.dtype)
    plan.constants["compressor_norm"][-ROPE_DIM:] = rope_tie_tail(block * spec.ratio)
    origin = min(step.total - step.kv_window for step in plan.steps)  # keep only the kv rows the windows reach
    plan.kv_history, plan.history_origin = plan.kv_history[:, origin:], origin
    return plan


# Index-query RoPE pair 10 at position 34 turns by 0.8039 rad, above pi/4, where sinf must reduce its
# argument (the polynomial at the unreduced angle is one ulp off); a query that is dim 0 at 1 and this tail
# carries the ulp through bf16 and the Hadamard into a whole FP4 block of the transformed query.
REDUCTION_POSITION, REDUCTION_PAIR = 34, 10
REDUCTION_TAIL = np.array([0.96875, 1.78125], dtype=np.float32)
NEAR_TIE_SCALE_LIFT = 3  # E8M0 steps that lift the near-tie keys' scores over every other record's
NEAR_TIE_DRAWS = 1024  # last-block code draws per block scale the near-tie search scores
FP4_BLOCKS = INDEX_DIM // 32


def _reduction_query(shape: tuple[int, ...]) -> np.ndarray:
    """Index query rows that are zero but for dim 0 at 1 and REDUCTION_TAIL in the RoPE pair REDUCTION_PAIR."""
    query = np.zeros(shape, dtype=np.float32)
    first = INDEX_DIM - ROPE_DIM + 2 * REDUCTION_PAIR
    query[..., 0] = 1.0
    query[..., first : first + 2] = REDUCTION_TAIL
    return query


def _row_scores(transformed: np.ndarray, weights: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """The reference's index scores of one query row (heads' transformed queries [I, 128], weights [I])
    over packed keys [n, 68]: dots ascending in d, then the head sum, every step binary32."""
    logical = decode_fp4_record(keys)
    scale = head_weight_scale(INDEX_DIM, len(weights))
    total = np.zeros(len(keys), dtype=np.float32)
    for query, weight in zip(transformed, weights):
        dot = np.zeros(len(keys), dtype=np.float32)
        for d in range(INDEX_DIM):
            dot += query[d] * logical[:, d]
        total += np.fmax(dot, np.float32(0)) * weight * scale
    return total


def _select_keys(scores: np.ndarray) -> np.ndarray:
    """f32::total_cmp's order as unsigned keys (the index select's csa_select_key)."""
    bits = scores.astype(np.float32).view(np.uint32)
    return np.where(bits >> np.uint32(31), ~bits, bits | np.uint32(0x80000000))


def near_tie_keys(transformed: np.ndarray, weights: np.ndarray, records: int) -> np.ndarray:
    """Packed index keys [records, 68] for one query row (positive weights): keys 0..2 score in one bin of
    the top 24 bits of the selection's key, 1 above 0 above 2, whose key is the bin's least (low byte 0),
    so a radix select that stops a digit early gathers 0 before 1 and its tie walk ends at 2; the others
    score far below, halving. All are the first head's FP4 query lifted NEAR_TIE_SCALE_LIFT steps with the
    last block cleared; the three draw last-block codes at a lower block scale until three such sums turn
    up (the FP4 lattice makes the rest of every dot exact)."""
    query = transformed[0]
    scales, packed, _ = quantize_fp4_blocks(query.reshape(FP4_BLOCKS, 32))
    scales = scales + np.uint8(NEAR_TIE_SCALE_LIFT)
    codes = unpack_nibbles(packed)
    codes[-1] = 0
    live = np.flatnonzero(query[-32:])
    if live.size == 0:
        raise FixtureError("the near-tie keys need a query whose last FP4 block is not zero")
    sign = np.where(query[-32:][live] > 0, 0, 8).astype(np.uint8)  # E2M1 sign bit: positive products
    lowered = [pack_fp4_record(scales - np.uint8(step), pack_nibbles(codes)) for step in range(1, records - 2)]
    rng = np.random.default_rng(0)
    for drop in range(1, int(scales[-1])):
        drawn = np.broadcast_to(codes, (NEAR_TIE_DRAWS, *codes.shape)).copy()
        drawn[:, -1, live] = rng.integers(0, 8, (NEAR_TIE_DRAWS, live.size), dtype=np.uint8) | sign
        drawn_scales = np.broadcast_to(scales, (NEAR_TIE_DRAWS, FP4_BLOCKS)).copy()
        drawn_scales[:, -1] -= np.uint8(drop)
        keys = pack_fp4_record(drawn_scales, pack_nibbles(drawn))
        selection = _select_keys(_row_scores(transformed, weights, keys))
        for least in np.flatnonzero(selection & np.uint32(0xFF) == 0):
            same_bin = selection >> np.uint32(8) == selection[least] >> np.uint32(8)
            above = np.unique(selection[same_bin & (selection > selection[least])])
            if above.size >= 2:
                second, first = (np.flatnonzero(selection == key)[0] for key in above[-2:])
                return np.stack([keys[second], keys[first], keys[least], *lowered])
    raise FixtureError("no near-tie index keys for this query")


def near_tie_plan(spec: StreamSpec, seed: int, weights_seed: int, reduction_query: bool = True) -> StreamPlan:
    """A reset-carry random stream of one token whose every candidate record is one of the row's
    near_tie_keys (positive index weights; a decode before its block's end reads past records only):
    with top-1 the row's first and second scores differ only in the last radix digit of the selection's
    key. With ``reduction_query`` the index queries are the reduction design."""
    plan = quiet_history_plan(spec, seed, weights_seed)
    (step,) = plan.steps
    fresh = step.fresh
    if reduction_query:
        fresh["index_query"] = _reduction_query(fresh["index_query"].shape)
    fresh["index_weight"] = np.abs(fresh["index_weight"])
    transformed = finalize_index_query(fresh["index_query"], ROPE_DIM, step.start)
    keys = plan.initial_state["past_index_key"]
    for row in range(spec.batch):
        keys[row] = near_tie_keys(transformed[row, 0], fresh["index_weight"][row, 0], keys.shape[1])
    return plan


def _rope_tie_specs() -> dict[str, tuple[StreamSpec, object]]:
    shapes = (("fp8", 1, 1), ("f32", 1, 2), ("f32", 1, 1))
    return {f"r128-{cache}-rope-tie-block{block}": (
        StreamSpec(128, (1, 1), batch=batch, heads=heads, cache_format=FP8 if cache == "fp8" else "f32",
                   windows=MIN_WINDOW, start=block * 128 + 127), rope_tie_plan)
        for (cache, batch, heads), block in zip(shapes, rope_tie_blocks(128, len(shapes)))}


def _specs() -> dict[str, tuple[StreamSpec, object]]:
    return {
        "r4-n5-i3-k2-b2-sinks": (StreamSpec(4, (2,), batch=2, heads=5, index_heads=3, index_topk=2, start=12),
                                 sink_plan),
        "r4-n2-i3-k3-sinks": (StreamSpec(4, (3,), heads=2, index_heads=3, index_topk=3, start=20), sink_plan),
        "r4-n8-i5-k5": (StreamSpec(4, (2,), heads=8, index_heads=5, index_topk=5, start=24), reset_carry_plan),
        "r4-n1-i8-k8-b3": (StreamSpec(4, (1,), batch=3, index_heads=8, index_topk=8, start=40), reset_carry_plan),
        "r4-n3-i3-k1-past128": (StreamSpec(4, (2, 1), heads=3, index_heads=3, index_topk=1, start=130,
                                           windows=("min", 1)), reset_carry_plan),
        "r4-n1-i2-k2-b2-past128": (StreamSpec(4, (1, 1), batch=2, index_heads=2, index_topk=2, start=137,
                                              windows=(3, "min")), reset_carry_plan),
        "r128-fp8-b2n5-sinks": (StreamSpec(128, (2,), batch=2, heads=5, cache_format=FP8, start=126), sink_plan),
        "r128-f32-n8-sinks-past128": (StreamSpec(128, (2,), heads=8, cache_format="f32", start=140,
                                                 windows=("min",)), sink_plan),
        "r128-fp8-n2-b2-past128": (StreamSpec(128, (1, 1), batch=2, heads=2, cache_format=FP8, start=300,
                                              windows=(1, "min")), reset_carry_plan),
        "r128-fp8-rope-65536": (StreamSpec(128, (2,), cache_format=FP8, windows=MIN_WINDOW, start=T16 + 126),
                                far_plan),
        "r128-fp8-rope-131072": (StreamSpec(128, (2,), cache_format=FP8, windows=MIN_WINDOW, start=T17 + 126),
                                 far_plan),
        **{f"r128-{cache}-ties-b{batch}n{heads}": (
            StreamSpec(128, (1, 1), batch=batch, heads=heads, cache_format=FP8 if cache == "fp8" else "f32",
                       start=127), tie_plan)
           for cache in ("fp8", "f32") for batch, heads in ((1, 1), (2, 3), (1, 5))},
        **{f"r4-ties-b{batch}n{heads}-i{index_heads}": (
            StreamSpec(4, (1, 1), batch=batch, heads=heads, index_heads=index_heads, index_topk=topk, start=3),
            tie_plan)
           for batch, heads, index_heads, topk in ((1, 1, 4, 1), (2, 3, 4, 2), (1, 2, 5, 3))},
        **_rope_tie_specs(),
        "r4-n2-i2-k2-far-gates": (StreamSpec(4, (8,), heads=2, index_heads=2, index_topk=2), far_gate_plan),
        "r128-f32-far-gates": (StreamSpec(128, (2,), cache_format="f32", start=126), far_gate_plan),
        "r128-fp8-far-gates-b2": (StreamSpec(128, (2,), batch=2, cache_format=FP8, start=126), far_gate_plan),
    }


def _block_end_specs() -> dict[str, StreamSpec]:
    """A B = 2 ratio-128 step across the second block end (254, 255): its first query reads one record
    of a cache that holds two per batch row (the only ci steps where a query that reads records of batch
    row 1 sees fewer of them than the capacity). Both caches and a non-default ``scale``; the cases share
    their seed, so they store their rows once (``quiet_history_plan`` keeps the kv rows cheap)."""
    base = StreamSpec(128, (2,), batch=2, cache_format=FP8, start=254, windows=MIN_WINDOW)
    return {"r128-fp8-b2-block-end-in-step": base, "r128-f32-b2-block-end-in-step": replace(base, cache_format="f32"),
            "r128-fp8-b2-block-end-in-step-scale": replace(base, scale=0.0625)}


def _near_tie_specs() -> dict[str, tuple[StreamSpec, object]]:
    """Top-1 decodes that read past records only, each one of near_tie_keys: the row's first two scores
    differ in the last radix digit only (a radix select that stops a digit early selects the second). At
    position 34, the index queries are the reduction design, three shapes; at 28 with B = 2 the past cache's
    second batch row starts at byte 7 * 583, odd (a copy that takes 8-byte words there faults on a GPU),
    with random queries. The cases share their seed, so those at 34 differ only in their index arrays."""
    at_pi4 = dict(index_topk=1, start=REDUCTION_POSITION)
    return {"r4-near-tie-i1": (StreamSpec(4, (1,), **at_pi4), near_tie_plan),
            "r4-near-tie-i3": (StreamSpec(4, (1,), index_heads=3, **at_pi4), near_tie_plan),
            "r4-near-tie-b2n2-i2": (StreamSpec(4, (1,), batch=2, heads=2, index_heads=2, **at_pi4), near_tie_plan),
            "r4-near-tie-b2-unaligned-rows": (StreamSpec(4, (1,), batch=2, index_topk=1, start=28),
                                              partial(near_tie_plan, reduction_query=False))}


def recipes(suite: str, seed: int) -> list[Recipe]:
    if suite not in ("ci", "full"):
        return []
    cases = [spec_recipe(FAMILY, name, spec, seed, plan=plan) for name, (spec, plan) in _specs().items()]
    shared = case_seed(seed, f"{FAMILY}.block-end-in-step")
    for name, spec in _block_end_specs().items():
        recipe = spec_recipe(FAMILY, name, spec, seed, f"{describe(spec)}; kv rows before the step zero",
                             plan=quiet_history_plan)
        cases.append(replace(recipe, seed=shared))
    shared = case_seed(seed, f"{FAMILY}.near-tie")
    for name, (spec, plan) in _near_tie_specs().items():
        cases.append(replace(spec_recipe(FAMILY, name, spec, seed, plan=plan), seed=shared))
    return cases
