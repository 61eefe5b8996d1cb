"""Family ``long``: streams resumed at 2^16 .. 2^20 + 3 tokens whose index scores never tie.

Kernel bugs of long contexts live past the short suites: RoPE angles of
positions past 2^17, record and byte offsets past 2^16 records and 2^27
bytes, int32 offset arithmetic. The reference refuses a ratio-4 row with any
two equal index scores, and random keys all but surely tie among 2^16
records, so these recipes repair the synthesized past index keys: the
steps' own index queries are finalized and scored against every past key,
and each key that ties another in some row is drawn again until every row's
scores are distinct (records the steps write themselves are left to the
recipe's redraw, except in a long prefill: an 8K prefill's own 2,048 keys
tie in some of its 8,192 rows, so its steps' index compressor rows are
redrawn until none does). The past state is synthesized directly as stored bytes
(E4M3 codes and E2M1 nibbles drawn through quantile tables of a normal, at
the block scales finalization gives normalized records), so a million-token
state costs about a second; kv rows exist only where a step's window reads.
Steps store no decoded caches (``logical_records``, ``logical_keys``): at
2^20 tokens those are 640 MiB a step, and readers decode the stored cache.

Suites: ``long`` — production geometry (N = I = 64, top-k 512; ratio 128
with f32 and FP8 caches) at T = 2^16, 2^17 - 1, 2^17, 2^18, 2^20, 2^20 + 3,
decodes and short prefills (not committed); ``full`` — a few small long
steps (B = 1, N = 1-2).
"""

from __future__ import annotations

from functools import cache, partial
from statistics import NormalDist

import numpy as np

from csa_conform.contract import validate_step
from csa_conform.errors import FixtureError
from csa_conform.golden.recipes.randomized import (
    StreamSpec,
    Values,
    case_seed,
    describe,
    filled_carry,
    step_plans,
    weights,
    weights_seed,
)
from csa_conform.golden.recipes.stream import Recipe, StepPlan, StreamPlan, assemble, empty_state
from csa_conform.numerics.bf16 import bf16_round
from csa_conform.numerics.fp4 import E2M1_MAX, FP4_BLOCK, e2m1_encode, pack_nibbles
from csa_conform.numerics.fp8 import FP8_BLOCK, e4m3_encode
from csa_conform.numerics.records import (
    FP4_BLOCKS,
    FP8_BLOCKS,
    HEAD_DIM,
    INDEX_DIM,
    ROPE_DIM,
    decode_fp8_record,
    pack_fp4_record,
    pack_fp8_record,
)
from csa_conform.oracle.engine import resolve_engine
from csa_conform.oracle.index_scoring import causal_mask
from csa_conform.spec import BY_NAME

FAMILY = "long"
E8M0_BIAS = 127
# Block scale powers of normalized records: amax of 64 unit normals ~2.5, so
# ceil(log2(2.5/448)) = -7 for FP8; Hadamard rows of 32 give ceil(log2(2.5/6)) = -1 for FP4.
FP8_POWERS = (-8, -7, -6)
FP4_POWERS = (-2, -1, 0)
# A repair pass redraws every tied key; a few passes settle a million records.
MAX_REPAIRS = 16
# Steps this long also redraw the keys they write: the 4-token prefills of the suite never tie,
# an 8K prefill's 2,048 keys tie in hundreds of its rows.
PREFILL_REPAIR = 1024
MIN_WINDOW = ("min",)


@cache
def _code_table(encode, limit: float, power: int) -> np.ndarray:
    """256 codes of the normal's quantiles (i + 0.5)/256 at scale 2^power, a byte per draw."""
    normal = NormalDist()
    quantiles = np.array([normal.inv_cdf((i + 0.5) / 256) for i in range(256)], dtype=np.float32)
    scaled = np.clip(quantiles * np.float32(2.0**-power), -limit, limit).astype(np.float32)
    return encode(scaled)


def _scale_bytes(rng: np.random.Generator, shape, powers) -> np.ndarray:
    return (rng.choice(np.array(powers), size=shape) + E8M0_BIAS).astype(np.uint8)


def attention_records(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """u8[..., 583] hybrid records of unit-normal values: codes, scale bytes and bf16 tail drawn directly."""
    table = _code_table(e4m3_encode, 448.0, FP8_POWERS[1])
    codes = table[rng.integers(0, 256, shape + (FP8_BLOCKS, FP8_BLOCK), dtype=np.uint8)]
    tail = bf16_round(rng.standard_normal(shape + (ROPE_DIM,), dtype=np.float32))
    return pack_fp8_record(_scale_bytes(rng, shape + (FP8_BLOCKS,), FP8_POWERS), codes, tail)


def index_records(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """u8[..., 68] FP4 index keys of unit-normal Hadamard rows (never code 8, as the quantizer)."""
    table = _code_table(e2m1_encode, float(E2M1_MAX), FP4_POWERS[1])
    codes = table[rng.integers(0, 256, shape + (FP4_BLOCKS, FP4_BLOCK), dtype=np.uint8)]
    return pack_fp4_record(_scale_bytes(rng, shape + (FP4_BLOCKS,), FP4_POWERS), pack_nibbles(codes))


def long_state(spec: StreamSpec, rng: np.random.Generator, carry_values: Values) -> dict[str, np.ndarray]:
    """past_* inputs at ``spec.start``: start // R records and the current block's carry."""
    attrs, batch, ratio = spec.attrs(), spec.batch, spec.ratio
    state = empty_state(attrs, batch)
    records = spec.start // ratio
    in_block = range(spec.start % ratio)
    packed = attention_records(rng, (batch, records))
    state["past_compressed_kv"] = decode_fp8_record(packed) if attrs["cache_format"] == "f32" else packed
    if ratio == 128:
        state["past_compression_carry"] = filled_carry(carry_values, batch, 128, HEAD_DIM, in_block)
        return state
    filled = [4 + slot for slot in in_block] + list(range(4))
    state["past_compression_carry"] = filled_carry(carry_values, batch, 8, 2 * HEAD_DIM, filled)
    state["past_index_key"] = index_records(rng, (batch, records))
    state["past_index_carry"] = filled_carry(carry_values, batch, 8, 2 * INDEX_DIM, filled)
    return state


def _all_rows(plan: StreamPlan) -> StepPlan:
    """Every step's query rows as one step from the initial state: the same positions, queries and weights."""
    first = plan.steps[0]
    fresh = {
        name: np.concatenate([step.fresh[name] for step in plan.steps], axis=1)
        for name in first.fresh
        if name != "attention_bias"
    }
    window = first.kv_window + sum(step.sequence for step in plan.steps[1:])
    return StepPlan(start=first.start, fresh=fresh, kv_window=window)


def tie_free_keys(plan: StreamPlan, rng: np.random.Generator) -> np.ndarray:
    """The plan's past index keys with every tie among them, in any row of any step, drawn away."""
    keys = plan.initial_state["past_index_key"].copy()
    if keys.shape[1] == 0:
        return keys
    rows = _all_rows(plan)
    inputs = assemble(plan, rows, plan.initial_state)
    geometry = validate_step(plan.attrs, inputs, list(plan.output_names))
    engine = resolve_engine()
    transformed = engine.index_query_finalize(geometry, inputs["index_query"])[0]["transformed"]

    past = keys.shape[1]
    written = np.zeros((keys.shape[0], geometry.next_records - past, keys.shape[2]), dtype=np.uint8)

    def score(packed: np.ndarray) -> np.ndarray:
        return engine.index_scoring(geometry, transformed, packed, inputs["index_weight"], None)[0]["scores"]

    # Whole rows as the stage sees them first (the records the steps write stand in as zeros and are
    # not judged), then only the redrawn keys: scoring a record never depends on the others.
    scores = score(np.concatenate([keys, written], axis=1))[..., :past]
    for _ in range(MAX_REPAIRS):
        tied = _tied_records(scores)
        if tied.size == 0:
            return keys
        keys[:, tied] = index_records(rng, (keys.shape[0], tied.size))
        scores[..., tied] = score(np.ascontiguousarray(keys[:, tied]))
    raise FixtureError(f"index keys still tie after {MAX_REPAIRS} repairs")


def tie_free_written_keys(plan: StreamPlan, rng: np.random.Generator) -> None:
    """Redraw, in place, the index compressor rows of every key the plan's one step writes that ties
    another in some row (a prefill writes S/4 keys and all of its S rows judge them).

    Record c pools channel 1 (the second half of the row) of positions 4c..4c+3 only, so redrawing
    those rows changes key c alone; each pass finalizes the step's keys and scores every row with
    the oracle's own stage functions, until no row ties.
    """
    (step,) = plan.steps
    inputs = assemble(plan, step, plan.initial_state)
    geometry = validate_step(plan.attrs, inputs, list(plan.output_names))
    engine = resolve_engine()
    transformed = engine.index_query_finalize(geometry, inputs["index_query"])[0]["transformed"]
    live = causal_mask(geometry, geometry.next_records, None)
    past = plan.initial_state["past_index_key"].shape[1]
    rows = step.fresh["index_compressor_kv"]
    key_inputs = BY_NAME["index_key_update"].inputs
    for _ in range(MAX_REPAIRS):
        keys = engine.index_key_update(geometry, *(inputs[name] for name in key_inputs))["present_index_key"]
        scores = engine.index_scoring(geometry, transformed, keys, inputs["index_weight"], None)[0]["scores"]
        tied = _tied_records(np.where(live, scores, np.float32(np.nan)))
        if tied.size == 0:
            return
        if (tied < past).any():
            raise FixtureError("a written index key ties a past one: repair the past keys first")
        positions = (4 * tied[:, None] + np.arange(4)[None, :] - step.start).ravel()
        if positions.min() < 0:
            raise FixtureError("a tied index key pools positions before the step: start the step on a block")
        rows[:, positions, INDEX_DIM:] = bf16_round(
            rng.standard_normal((rows.shape[0], positions.size, INDEX_DIM), dtype=np.float32))
    raise FixtureError(f"written index keys still tie after {MAX_REPAIRS} repairs")


def _tied_records(scores: np.ndarray) -> np.ndarray:
    """Records whose score equals a lower-ranked record's in some row (one of each tied group stays;
    NaN, which equals nothing, marks records a row does not judge)."""
    rows = scores.reshape(-1, scores.shape[-1])
    order = np.argsort(rows, axis=-1, kind="stable")
    ranked = np.take_along_axis(rows, order, axis=-1)
    repeated = ranked[:, 1:] == ranked[:, :-1]
    return np.unique(order[:, 1:][repeated])


def long_plan(spec: StreamSpec, seed: int, weights_seed: int) -> StreamPlan:
    """A stream resumed at ``spec.start`` from a synthesized state, with tie-free past index keys."""
    values, bias = Values(seed), Values(seed + 1)
    steps = step_plans(spec, values, bias)
    origin = min(step.total - step.kv_window for step in steps)
    history = values.coarse((spec.batch, spec.start + sum(spec.chunks) - origin, HEAD_DIM))
    rng = np.random.default_rng(seed + 2)
    plan = StreamPlan(
        attrs=spec.attrs(),
        output_names=spec.output_names(),
        constants=weights(spec, weights_seed),
        kv_history=history,
        initial_state=long_state(spec, rng, Values(seed + 3)),
        steps=steps,
        history_origin=origin,
        decoded_payloads=False,
    )
    if spec.ratio == 4:
        plan.initial_state["past_index_key"] = tie_free_keys(plan, rng)
    if spec.ratio == 4 and sum(spec.chunks) >= PREFILL_REPAIR:
        tie_free_written_keys(plan, rng)
    return plan


def _r4(start: int, chunks: tuple[int, ...], heads: int = 64, index_heads: int = 64) -> StreamSpec:
    return StreamSpec(
        4, chunks, heads=heads, index_heads=index_heads, index_topk=512, windows=MIN_WINDOW,
        start=start, index_offset=0.0,
    )


def _r128(start: int, chunks: tuple[int, ...], cache_format: str, heads: int = 64) -> StreamSpec:
    return StreamSpec(128, chunks, heads=heads, cache_format=cache_format, windows=MIN_WINDOW, start=start)


FP8 = "fp8_e4m3_block64"
T16, T17, T18, T20 = 1 << 16, 1 << 17, 1 << 18, 1 << 20
PREFILL_TOKENS = 1 << 13


def prefill_spec(heads: int) -> StreamSpec:
    """An 8K-token prefill from position 0 (I = 64, top-k 512): its 8,192 rows judge the 2,048 keys
    it writes, rows past 2,048 tokens select 512 of up to 2,048 records."""
    return _r4(0, (PREFILL_TOKENS,), heads=heads)


def _long_specs() -> dict[str, StreamSpec]:
    """Decodes that end on T = 2^k (a block end, so a new record) and continue one past it,
    decodes at the odd T = 2^17 - 1 and 2^20 + 3, and 4-token prefills across 2^17 and 2^20."""
    return {
        "r4-n64-t65536": _r4(T16 - 1, (1, 1)),
        "r4-n64-t131071": _r4(T17 - 2, (1, 1)),
        "r4-n64-prefill-t131072": _r4(T17 - 4, (4,)),
        "r4-n64-t262144": _r4(T18 - 1, (1,)),
        "r4-n64-t1048576": _r4(T20 - 1, (1, 1)),
        "r4-n64-t1048579": _r4(T20 + 2, (1,)),
        "r4-n64-prefill-t1048579": _r4(T20 - 1, (4,)),
        "r128-fp8-n64-t131071": _r128(T17 - 2, (1, 1), FP8),
        "r128-f32-n64-t262144": _r128(T18 - 1, (1,), "f32"),
        "r128-fp8-n64-t1048576": _r128(T20 - 1, (1, 1), FP8),
        "r128-f32-n64-t1048576": _r128(T20 - 1, (1, 1), "f32"),
        "r128-fp8-n64-prefill-t1048579": _r128(T20 - 1, (4,), FP8),
        "r128-f32-n64-t1048579": _r128(T20 + 2, (1,), "f32"),
    }


def _full_specs() -> dict[str, StreamSpec]:
    """Small steps at long positions: B = 1, N = 1-2, few records where the cache is FP8."""
    return {
        "r4-n1-i8-t65537": _r4(T16, (1,), heads=1, index_heads=8),
        "r4-n2-i8-prefill-t65537": _r4(T16 - 2, (3,), heads=2, index_heads=8),
        "r128-fp8-n1-t1048579": _r128(T20 + 2, (1,), FP8, heads=1),
        "r128-f32-n2-t131071": _r128(T17 - 2, (1, 1), "f32", heads=2),
    }


def recipes(suite: str, seed: int) -> list[Recipe]:
    specs = {"long": _long_specs, "full": _full_specs}.get(suite)
    if specs is None:
        return []
    cases = []
    for name, spec in specs().items():
        case_id = f"{FAMILY}.{name}"
        build = partial(long_plan, spec, weights_seed=weights_seed(seed))
        description = describe(spec) + "; tie-free synthesized index keys" * (spec.ratio == 4)
        cases.append(Recipe(case_id, FAMILY, case_seed(seed, case_id), description, build, True, spec.weight()))
    return cases
