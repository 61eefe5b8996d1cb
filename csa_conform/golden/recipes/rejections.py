"""Family ``errors``: one step per validation rule that the reference must reject.

Validation is part of the contract (specs/contract.md): the reference refuses
bad attributes, arity, dtypes, shapes, non-finite inputs and carries, cursor
mismatches, a short current_kv, a bias that does not broadcast, top-k ties
and records it cannot finalize — each with an exact message. Every recipe
here takes a small valid step and breaks exactly one rule; the generator
stores the oracle's message as ``expect_error`` and ``verify`` demands that
exact text again. All bases of a ratio draw from one seed, so cases broken
from bases of the same shapes (with or without a bias, f32 or FP8 cache)
share their untouched inputs, stored once.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import numpy as np

from csa_conform.golden.recipes.randomized import StreamSpec, case_seed, random_plan, weights_seed
from csa_conform.golden.recipes.stream import (
    FP8_RECORD_BYTES,
    HEAD_DIM,
    RATIO4_OUTPUTS_6,
    RATIO128_OUTPUTS,
    Recipe,
    StreamPlan,
    empty_state,
)
from csa_conform.numerics.records import FP8_BLOCK_BYTES

FAMILY = "errors"

BASES = {
    "r4": StreamSpec(4, (4,), index_heads=1, index_topk=2),
    "r4-b2": StreamSpec(4, (2,), batch=2, index_heads=1, index_topk=2),
    "r4-bias": StreamSpec(4, (4,), index_heads=1, index_topk=2, bias=((True, True, True, True),)),
    "r4-resumed": StreamSpec(4, (1,), index_heads=1, index_topk=2, start=9),
    "r128": StreamSpec(128, (4,), cache_format="f32"),
    "r128-fp8": StreamSpec(128, (4,), cache_format="fp8_e4m3_block64"),
    "r128-bias": StreamSpec(128, (4,), cache_format="f32", bias=((True, True, True, True),)),
    "r128-block-end": StreamSpec(128, (1,), cache_format="f32", start=127),
}

Mutation = Callable[[StreamPlan], None]
_DELETE = object()


def _attrs(**changes) -> Mutation:
    def mutate(plan: StreamPlan) -> None:
        for name, value in changes.items():
            if value is _DELETE:
                plan.attrs.pop(name, None)
            else:
                plan.attrs[name] = value

    return mutate


def _outputs(names) -> Mutation:
    def mutate(plan: StreamPlan) -> None:
        plan.output_names = tuple(names)

    return mutate


def _inputs(**values) -> Mutation:
    """Replace (or with None remove) assembled inputs; a callable receives the plan."""

    def mutate(plan: StreamPlan) -> None:
        for name, value in values.items():
            plan.steps[-1].replace[name] = value(plan) if callable(value) else value

    return mutate


def _fresh(name: str):
    return lambda plan: plan.steps[-1].fresh[name]


def _constant(name: str):
    return lambda plan: plan.constants[name]


def _state(name: str):
    return lambda plan: plan.initial_state[name]


def _total(plan: StreamPlan) -> int:
    return plan.steps[-1].total


def _edit(source, edit: Callable[[np.ndarray], np.ndarray | None]):
    """A copy of ``source(plan)`` changed in place by ``edit`` (or replaced by its result)."""

    def value(plan: StreamPlan) -> np.ndarray:
        array = np.array(source(plan))
        result = edit(array)
        return array if result is None else result

    return value


def _poison(source, value: float):
    """Put one non-finite value in the middle of a tensor (not at index 0: the message names it)."""

    def edit(array):
        array.reshape(-1)[min(array.size - 1, array.size // 2 + 1)] = np.float32(value)

    return _edit(source, edit)


def _resized(source, axis: int, extent: int):
    """A finite tensor of the wrong extent on one axis (its values never get read)."""

    def edit(array):
        shape = list(array.shape)
        shape[axis] = extent
        return np.full(shape, 0.5, dtype=array.dtype)

    return _edit(source, edit)


def _set(source, index: tuple, value: float):
    def edit(array):
        array[index] = value

    return _edit(source, edit)


def _cast(source, dtype):
    return _edit(source, lambda array: array.astype(dtype))


def _blank(source):
    """Zeros shaped like ``source(plan)``: the rule needs only the values set into it, and a
    blank [128, 512] APE costs the file nothing where a copy of the model's costs 100 KB."""
    return lambda plan: np.zeros_like(source(plan))


def _set_dims(source, dims, value: float, positions=slice(None)):
    def edit(array):
        array[..., positions, dims] = np.float32(value)

    return _edit(source, edit)


def _cursors(seqlens_delta=(0,), total_delta: int = 0) -> Mutation:
    def mutate(plan: StreamPlan) -> None:
        total = _total(plan) + total_delta
        batch = plan.kv_history.shape[0]
        deltas = np.resize(np.asarray(seqlens_delta), batch)
        plan.steps[-1].replace["seqlens_k"] = (total - 1 + deltas).astype(np.int32)
        plan.steps[-1].replace["total_sequence_length"] = np.array(total, dtype=np.int64)

    return mutate


def _history(plan: StreamPlan) -> np.ndarray:
    return plan.kv_history[:, : _total(plan)]


def _kv_window(extent: int) -> Mutation:
    """current_kv ending at T-1 with ``extent`` rows more (or, negative, fewer) than T."""

    def mutate(plan: StreamPlan) -> None:
        history = _history(plan)
        if extent > 0:
            window = np.concatenate([history[:, :extent], history], axis=1)
        else:
            window = history[:, -extent:]
        plan.steps[-1].replace["current_kv"] = np.ascontiguousarray(window)

    return mutate


def _corrupt_past(name: str, offset: int, byte: int) -> Mutation:
    def mutate(plan: StreamPlan) -> None:
        plan.initial_state[name][..., offset] = byte

    return mutate


def _reset_carries(plan: StreamPlan) -> None:
    """The crafted state of a block end: no earlier candidate, only the new row is pooled."""
    plan.initial_state = empty_state(plan.attrs, plan.kv_history.shape[0])


def _blank_history(plan: StreamPlan) -> None:
    """Zero kv rows for a step rejected while compressing, before attention reads any: the
    128 rows a block end at 127 needs would otherwise be 100 KB of values nothing reads."""
    plan.kv_history = np.zeros_like(plan.kv_history)


def _chain(*mutations: Mutation) -> Mutation:
    def mutate(plan: StreamPlan) -> None:
        for mutation in mutations:
            mutation(plan)

    return mutate


_NONFINITE = (np.nan, np.inf, -np.inf)
_FRESH_INPUTS = ("query", "compressor_kv", "compressor_gate", "index_query", "index_weight",
                 "index_compressor_kv", "index_compressor_gate")
_CONSTANT_INPUTS = ("compressor_ape", "compressor_norm", "head_sink", "index_compressor_ape",
                    "index_compressor_norm")


def _nonfinite_rules() -> dict:
    rules = {}
    for number, name in enumerate(_FRESH_INPUTS + _CONSTANT_INPUTS + ("current_kv",)):
        value = _NONFINITE[number % 3]
        if name == "current_kv":
            source = _history
        else:
            source = _constant(name) if name in _CONSTANT_INPUTS else _fresh(name)
        rules[f"nonfinite-{name}"] = ("r4", _inputs(**{name: _poison(source, value)}), f"{value} in {name}")
    rules["nonfinite-r128-query"] = ("r128", _inputs(query=_poison(_fresh("query"), np.nan)), "NaN in query")
    return rules


# Ratio-4 channel 1 of the main compressor: source dims 512.. (the current block's candidates).
_CHANNEL1 = slice(HEAD_DIM, 2 * HEAD_DIM)

RULES: dict[str, tuple[str, Mutation, str]] = {
    # attributes (factory)
    "attr-num-heads-missing": ("r4", _attrs(num_heads=_DELETE), "num_heads absent"),
    "attr-num-heads-zero": ("r4", _attrs(num_heads=0), "num_heads = 0"),
    "attr-num-heads-float": ("r4", _attrs(num_heads=1.0), "num_heads given as a float"),
    "attr-head-dim-missing": ("r128", _attrs(head_dim=_DELETE), "head_dim absent"),
    "attr-rope-exceeds-head-dim": ("r128", _attrs(qk_rope_head_dim=1024), "qk_rope_head_dim > head_dim"),
    "attr-rope-negative": ("r128", _attrs(qk_rope_head_dim=-64), "negative qk_rope_head_dim"),
    "attr-ratio-8": ("r128", _attrs(compression_ratio=8), "compression_ratio = 8"),
    "attr-ratio-missing": ("r128", _attrs(compression_ratio=_DELETE), "compression_ratio absent"),
    "attr-r4-index-topk-zero": ("r4", _attrs(index_topk=0), "ratio 4 with index_topk = 0"),
    "attr-r4-index-heads-missing": ("r4", _attrs(index_num_heads=_DELETE), "ratio 4 without index_num_heads"),
    "attr-r128-index-topk": ("r128", _attrs(index_topk=2), "ratio 128 with index_topk = 2"),
    "attr-causal-0": ("r4", _attrs(causal=0), "causal = 0"),
    "attr-cache-layout-2": ("r4", _attrs(cache_layout_version=2), "cache_layout_version = 2"),
    "attr-index-layout-2": ("r128", _attrs(index_layout_version=2), "index_layout_version = 2"),
    "attr-sink-mode-sink-tokens": ("r4", _attrs(sink_mode="sink_tokens"), "sink_mode = sink_tokens"),
    "attr-sink-mode-not-string": ("r4", _attrs(sink_mode=1), "sink_mode given as an int"),
    "attr-cache-format-unknown": ("r128", _attrs(cache_format="bf16"), "cache_format = bf16"),
    "attr-cache-format-not-string": ("r128", _attrs(cache_format=3), "cache_format given as an int"),
    "attr-scale-negative": ("r4", _attrs(scale=-0.5), "scale = -0.5"),
    "attr-scale-nan": ("r128", _attrs(scale=float("nan")), "scale = NaN"),
    "attr-r4-cache-f32": ("r4", _attrs(cache_format="f32"), "ratio 4 with cache_format f32"),
    "attr-r128-cache-fp4": ("r128-fp8", _attrs(cache_format="fp4_e2m1_block32"), "ratio 128 with FP4 cache"),
    "attr-r4-index-head-dim-64": ("r4", _attrs(index_head_dim=64), "ratio 4 with index_head_dim = 64"),
    "attr-r128-head-dim-256": ("r128", _attrs(head_dim=256), "ratio 128 with head_dim = 256"),
    "attr-r128-rope-32": ("r128", _attrs(qk_rope_head_dim=32), "ratio 128 with qk_rope_head_dim = 32"),
    # arity
    "arity-r4-four-outputs": ("r4", _outputs(RATIO4_OUTPUTS_6[:4]), "ratio 4 with 4 outputs"),
    "arity-r128-four-outputs": ("r128", _outputs(RATIO4_OUTPUTS_6[:4]), "ratio 128 with 4 outputs"),
    "arity-two-outputs": ("r128", _outputs(RATIO128_OUTPUTS[:2]), "2 outputs"),
    "arity-r128-missing-head-sink": ("r128", _inputs(head_sink=None), "10 positional inputs"),
    "arity-r4-omitted-seqlens": ("r4", _inputs(seqlens_k=None), "required input 8 omitted"),
    "arity-r4-missing-index-weight": ("r4", _inputs(index_weight=None), "index input 12 omitted"),
    "arity-r128-index-input": (
        "r128",
        _inputs(index_query=lambda plan: np.zeros((1, 4, 1, 128), dtype=np.float32)),
        "ratio 128 given index_query",
    ),
    # dtypes
    "dtype-query-f64": ("r4", _inputs(query=_cast(_fresh("query"), np.float64)), "float64 query"),
    "dtype-seqlens-i64": (
        "r128",
        _inputs(seqlens_k=lambda plan: np.array([_total(plan) - 1], dtype=np.int64)),
        "int64 seqlens_k",
    ),
    "dtype-total-i32": (
        "r128",
        _inputs(total_sequence_length=lambda plan: np.array(_total(plan), dtype=np.int32)),
        "int32 total_sequence_length",
    ),
    "dtype-r4-past-cache-f32": (
        "r4",
        _inputs(past_compressed_kv=np.zeros((1, 0, FP8_RECORD_BYTES), dtype=np.float32)),
        "float32 past cache for an FP8 node",
    ),
    "dtype-r128-fp8-past-cache-f32": (
        "r128-fp8",
        _inputs(past_compressed_kv=np.zeros((1, 0, HEAD_DIM), dtype=np.float32)),
        "float32 past cache for an fp8_e4m3_block64 node",
    ),
    "dtype-bias-f64": (
        "r4-bias",
        _inputs(attention_bias=_cast(_fresh("attention_bias"), np.float64)),
        "float64 bias",
    ),
    "dtype-bias-bool": (
        "r128-bias",
        _inputs(attention_bias=_cast(_fresh("attention_bias"), np.bool_)),
        "boolean bias",
    ),
    # shapes
    "shape-query-rank3": ("r4", _inputs(query=_edit(_fresh("query"), lambda a: a[:, :, 0])), "rank-3 query"),
    "shape-query-empty-sequence": (
        "r128",
        _inputs(query=np.zeros((1, 0, 1, HEAD_DIM), dtype=np.float32)),
        "query with S = 0",
    ),
    "shape-query-heads": ("r4", _inputs(query=_resized(_fresh("query"), 2, 2)), "query with 2 heads, N = 1"),
    "shape-current-kv-batch": (
        "r4",
        _inputs(current_kv=lambda plan: np.tile(_history(plan), (2, 1, 1))),
        "current_kv batch 2",
    ),
    "shape-compressor-kv-width": (
        "r4",
        _inputs(compressor_kv=_resized(_fresh("compressor_kv"), 2, 1000)),
        "width 1000",
    ),
    "shape-compressor-gate-sequence": (
        "r128",
        _inputs(compressor_gate=_resized(_fresh("compressor_gate"), 1, 3)),
        "gate with S = 3",
    ),
    "shape-r128-ape-rows": (
        "r128",
        _inputs(compressor_ape=_resized(_constant("compressor_ape"), 0, 127)),
        "127 APE rows",
    ),
    "shape-norm": (
        "r4",
        _inputs(compressor_norm=_resized(_constant("compressor_norm"), 0, 256)),
        "norm of 256",
    ),
    "shape-carry-slots": (
        "r4",
        _inputs(past_compression_carry=_resized(_state("past_compression_carry"), 1, 4)),
        "ratio-4 carry with 4 slots",
    ),
    "shape-r128-carry-slots": (
        "r128",
        _inputs(past_compression_carry=_resized(_state("past_compression_carry"), 1, 64)),
        "ratio-128 carry with 64 slots",
    ),
    "shape-head-sink": ("r4", _inputs(head_sink=_resized(_constant("head_sink"), 0, 2)), "2 sinks, N = 1"),
    "shape-seqlens-batch": (
        "r128",
        _inputs(seqlens_k=lambda plan: np.full(2, _total(plan) - 1, dtype=np.int32)),
        "seqlens_k of 2 rows, B = 1",
    ),
    "shape-total-rank1": (
        "r128",
        _inputs(total_sequence_length=lambda plan: np.array([_total(plan)], dtype=np.int64)),
        "total_sequence_length of shape [1]",
    ),
    "shape-index-query-heads": (
        "r4",
        _inputs(index_query=_resized(_fresh("index_query"), 2, 2)),
        "2 index heads, I = 1",
    ),
    "shape-index-weight": (
        "r4",
        _inputs(index_weight=_resized(_fresh("index_weight"), 2, 3)),
        "3 weights, I = 1",
    ),
    "shape-index-ape": (
        "r4",
        _inputs(index_compressor_ape=_resized(_constant("index_compressor_ape"), 1, 255)),
        "index APE width 255",
    ),
    "shape-past-index-key-width": (
        "r4",
        _inputs(past_index_key=np.zeros((1, 0, 67), dtype=np.uint8)),
        "67-byte index records",
    ),
    "shape-past-cache-records": (
        "r4",
        _inputs(past_compressed_kv=np.zeros((1, 1, FP8_RECORD_BYTES), dtype=np.uint8)),
        "one past record at start 0",
    ),
    "shape-r128-past-cache-records": (
        "r128",
        _inputs(past_compressed_kv=np.zeros((1, 1, HEAD_DIM), dtype=np.float32)),
        "one past f32 record at start 0",
    ),
    "shape-bias-rank5": (
        "r4-bias",
        _inputs(attention_bias=_edit(_fresh("attention_bias"), lambda a: a[None])),
        "rank-5 bias",
    ),
    "shape-bias-not-broadcastable": (
        "r4-bias",
        _inputs(attention_bias=_resized(_fresh("attention_bias"), 3, 9)),
        "bias with one candidate too many",
    ),
    "shape-r128-bias-batch": (
        "r128-bias",
        _inputs(attention_bias=_resized(_fresh("attention_bias"), 0, 3)),
        "bias batch 3, B = 1",
    ),
    # cursors
    "cursor-seqlens-mismatch": ("r4", _cursors(seqlens_delta=(1,)), "seqlens_k[0] + 1 != total"),
    "cursor-rows-unequal": ("r4-b2", _cursors(seqlens_delta=(0, -1)), "rows of different length"),
    "cursor-r128-rows-unequal": ("r128", _cursors(seqlens_delta=(-1,)), "seqlens_k[0] + 1 < total"),
    "cursor-total-negative": ("r128", _cursors(total_delta=-5), "total_sequence_length = -1"),
    "cursor-total-shorter-than-sequence": ("r4", _cursors(total_delta=-2), "total 2 < S = 4"),
    "cursor-current-kv-longer-than-total": ("r4", _kv_window(1), "current_kv of T + 1 rows"),
    "cursor-current-kv-too-short": ("r4", _kv_window(-1), "current_kv missing position 0"),
    "cursor-r128-current-kv-too-short": ("r128", _kv_window(-1), "current_kv missing position 0"),
    # carries
    "carry-kv-nan": (
        "r4",
        _inputs(past_compression_carry=_set(_state("past_compression_carry"), (0, 2, 0, 7), np.nan)),
        "NaN carry kv",
    ),
    "carry-score-posinf": (
        "r4",
        _inputs(past_compression_carry=_set(_state("past_compression_carry"), (0, 5, 1, 9), np.inf)),
        "+inf carry score",
    ),
    "carry-r128-score-nan": (
        "r128",
        _inputs(past_compression_carry=_set(_state("past_compression_carry"), (0, 77, 1, 3), np.nan)),
        "NaN carry score",
    ),
    "index-carry-kv-inf": (
        "r4",
        _inputs(past_index_carry=_set(_state("past_index_carry"), (0, 1, 0, 200), np.inf)),
        "+inf index carry kv",
    ),
    # pipeline-time rejections
    "topk-tie-zero-weights": (
        "r4-resumed",
        _inputs(index_weight=_edit(_fresh("index_weight"), lambda a: np.zeros_like(a))),
        "zero index weights: every score 0, a top-k tie",
    ),
    "softmax-nan-bias": (
        "r4-bias",
        _inputs(attention_bias=_poison(_fresh("attention_bias"), np.nan)),
        "NaN bias: softmax denominator NaN",
    ),
    "softmax-r128-inf-bias": (
        "r128-bias",
        _inputs(attention_bias=_poison(_fresh("attention_bias"), np.inf)),
        "+inf bias: softmax denominator NaN",
    ),
    "compression-no-finite-score": (
        "r4",
        _chain(
            _inputs(compressor_gate=_set_dims(_fresh("compressor_gate"), HEAD_DIM + 5, -3.0e38)),
            _inputs(compressor_ape=_set_dims(_blank(_constant("compressor_ape")), HEAD_DIM + 5, -3.0e38)),
        ),
        "gate + APE overflow to -inf for every candidate of dim 5",
    ),
    "compression-infinite-score": (
        "r4",
        _chain(
            _inputs(compressor_gate=_set_dims(_fresh("compressor_gate"), HEAD_DIM + 9, 3.0e38, 2)),
            _inputs(compressor_ape=_set_dims(_blank(_constant("compressor_ape")), HEAD_DIM + 9, 3.0e38, 2)),
        ),
        "gate + APE overflow to +inf for one candidate of dim 9",
    ),
    "r128-compression-infinite-score": (
        "r128-block-end",
        _chain(
            _reset_carries,
            _blank_history,
            _inputs(compressor_gate=_set_dims(_fresh("compressor_gate"), 17, 3.0e38)),
            _inputs(compressor_ape=_set_dims(_blank(_constant("compressor_ape")), 17, 3.0e38, 127)),
        ),
        "ratio 128: a +inf score at the block end 127",
    ),
    "r128-compression-no-finite-score": (
        "r128-block-end",
        _chain(
            _reset_carries,
            _blank_history,
            _inputs(compressor_gate=_set_dims(_fresh("compressor_gate"), 33, -3.0e38)),
            _inputs(compressor_ape=_set_dims(_blank(_constant("compressor_ape")), 33, -3.0e38)),
        ),
        "ratio 128: the only score of dim 33 at the block end 127 overflows to -inf",
    ),
    "compression-softmax-invalid": (
        "r4",
        _inputs(compressor_kv=_set_dims(_fresh("compressor_kv"), _CHANNEL1, 3.0e38)),
        "values of 3e38 in every candidate: the pooled numerator overflows",
    ),
    "rmsnorm-nonfinite": (
        "r4",
        _inputs(compressor_kv=_set_dims(_fresh("compressor_kv"), _CHANNEL1, 1.0e30)),
        "pooled record of 1e30: RMSNorm square sum overflows",
    ),
    "index-rmsnorm-nonfinite": (
        "r4",
        _inputs(index_compressor_kv=_set_dims(_fresh("index_compressor_kv"), slice(128, 256), 1.0e30)),
        "pooled index record of 1e30: RMSNorm square sum overflows",
    ),
    "past-cache-scale-0xff": (
        "r4-resumed",
        _corrupt_past("past_compressed_kv", FP8_BLOCK_BYTES, 0xFF),
        "decode resumed at 9 whose past FP8 record has E8M0 scale byte 0xff",
    ),
    "past-cache-code-0x7f": (
        "r4-resumed",
        _corrupt_past("past_compressed_kv", 3, 0x7F),
        "decode resumed at 9 whose past FP8 record holds the E4M3 NaN code 0x7f",
    ),
    **_nonfinite_rules(),
}


def rejection_plan(rule: str, seed: int, weights_seed: int) -> StreamPlan:
    base, mutate, _ = RULES[rule]
    plan = random_plan(BASES[base], seed, weights_seed)
    mutate(plan)
    plan.steps[-1].expect_error = True
    return plan


def recipes(suite: str, seed: int) -> list[Recipe]:
    cases = []
    for rule, (base, _, what) in RULES.items():
        case_id = f"{FAMILY}.{rule}"
        build = partial(rejection_plan, rule, weights_seed=weights_seed(seed))
        base_seed = case_seed(seed, f"{FAMILY}.r{BASES[base].ratio}")
        cases.append(Recipe(case_id, FAMILY, base_seed, f"rejected: {what} ({base} step)", build))
    return cases
