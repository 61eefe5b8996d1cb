"""Family ``seed-closed-form``: the value generators of the CPU seed's own stream tests.

Seed 001 pins its stateful behaviour with two tests whose inputs are closed
formulas of (position, dim): the ratio-128 carry across the 256 boundary and
the ratio-4 index compression streaming to 8 and 16. These recipes feed the
same formulas (evaluated in binary32, left to right, as the Rust test does)
through streams, so the goldens hold the very steps those tests reason about
— including the record at block start 128 whose first bytes the seed pins.
The ratio-4 prefill of 8 is sent stale carries, which the contract clears
(the seed's test starts from cleared ones: the outputs are the same).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from csa_conform.golden.recipes.stream import (
    HEAD_DIM,
    INDEX_DIM,
    RATIO4_OUTPUTS_6,
    RATIO128_OUTPUTS,
    Recipe,
    StepPlan,
    StreamPlan,
    base_attrs,
    empty_state,
    stale_carries,
)

FAMILY = "seed-closed-form"
F = np.float32


def _grid(positions, width: int):
    """Broadcastable (position, dim) integer grids."""
    return np.asarray(positions, dtype=np.int64)[:, None], np.arange(width, dtype=np.int64)[None, :]


def _f(integers) -> np.ndarray:
    return np.asarray(integers).astype(np.float32)


# --- ratio 128: `ratio128_stateful_carry_matches_full_recompute_across_decode_boundary` ----

R128 = 128


def r128_compressor_value(p, d):
    return (
        F(0.4)
        + _f(p % R128) * F(0.00625)
        + _f(p // R128) * F(0.03125)
        + _f(d % 23) * F(0.009)
        + _f((p * 11 + d * 3) % 7) * F(0.001)
    )


def r128_compressor_score(p, d):
    return _f((p * 3 + d * 5) % 19) * F(0.0625) - F(0.5625) + _f((p + d) % 3) * F(0.015625)


def r128_ape(slot, d):
    return F(0.03125) + _f((slot * 5 + d * 7) % 17) * F(0.0078125) - F(0.0625)


def r128_query(p, d):
    return F(0.01) + _f((p * 17 + d * 13) % 37) * F(0.00025)


def r128_kv(p, d):
    return F(0.2) + _f((p * 7 + d * 11) % 41) * F(0.0125) + _f(p % 5) * F(0.003)


def _r128_rows(function, start: int, count: int) -> np.ndarray:
    p, d = _grid(range(start, start + count), HEAD_DIM)
    return np.ascontiguousarray(function(p, d), dtype=np.float32)[None]


def _r128_gate(start: int, count: int) -> np.ndarray:
    p, d = _grid(range(start, start + count), HEAD_DIM)
    return (r128_compressor_score(p, d) - r128_ape(p % R128, d)).astype(np.float32)[None]


def _r128_step(start: int, count: int, window: int | None) -> StepPlan:
    return StepPlan(
        start=start,
        fresh={
            "query": _r128_rows(r128_query, start, count)[:, :, None, :],
            "compressor_kv": _r128_rows(r128_compressor_value, start, count),
            "compressor_gate": _r128_gate(start, count),
        },
        kv_window=window,
    )


def ratio128_plan(chunks: tuple[tuple[int, int, int | None], ...], seed: None = None) -> StreamPlan:
    """Chunks of (start, length, kv window); block 0 [0, 128) is always the first chunk.

    Closed formulas draw nothing: ``seed`` is accepted for the Recipe protocol only.
    """
    attrs = base_attrs(128, 1, cache_format="fp8_e4m3_block64")
    slot, d = _grid(range(R128), HEAD_DIM)
    last = max(start + length for start, length, _ in chunks)
    return StreamPlan(
        attrs=attrs,
        output_names=RATIO128_OUTPUTS,
        constants={
            "compressor_ape": r128_ape(slot, d).astype(np.float32),
            "compressor_norm": (F(0.75) + _f(np.arange(HEAD_DIM) % 17) * F(0.03125)),
            "head_sink": np.array([-0.375], dtype=np.float32),
        },
        kv_history=_r128_rows(r128_kv, 0, last),
        initial_state=empty_state(attrs, 1),
        steps=[_r128_step(start, length, window) for start, length, window in chunks],
    )


# --- ratio 4: `ratio4_index_compression_topk_and_streaming_match_independent_oracle` ------

R4 = 4
INDEX_HEADS = 2
TOPK = 2


def r4_main_value(p, ch, d):
    return F(0.35) + _f(p) * F(0.017) + _f(ch) * F(0.11) + _f(d % 29) * F(0.0065)


def r4_main_score(p, ch, d):
    return _f((p * 7 + ch * 11 + d * 3) % 23) * F(0.041) - F(0.37)


def r4_index_value(p, ch, d):
    return F(0.22) + _f(p) * F(0.023) + _f(ch) * F(0.085) + _f(d % 19) * F(0.008)


def r4_index_score(p, ch, d):
    return _f((p * 13 + ch * 5 + d * 7) % 31) * F(0.027) - F(0.29)


def r4_main_ape(slot, source):
    return _f((slot * 17 + source * 3) % 37) * F(0.002) - F(0.031)


def r4_index_ape(slot, source):
    return _f((slot * 11 + source * 5) % 29) * F(0.0025) - F(0.027)


def r4_query(p, d):
    return F(0.012) + _f((p * 19 + d * 7) % 43) * F(0.0007)


def r4_dense(p, d):
    return F(0.18) + _f((p * 5 + d * 11) % 47) * F(0.009)


def r4_index_query(p, h, d):
    return (
        F(0.08)
        + _f(p) * F(0.0017)
        + _f(h) * F(0.013)
        + _f((d * 9 + p * 3 + h) % 41) * F(0.003)
    )


def r4_index_weight(p, h):
    return F(0.65) + _f(p) * F(0.009) + _f(h) * F(0.17)


def _two_channel(value, start: int, count: int, width: int) -> np.ndarray:
    """[1, count, 2*width] rows: source dim sd reads channel sd // width, dim sd % width."""
    p, source = _grid(range(start, start + count), 2 * width)
    return value(p, source // width, source % width).astype(np.float32)[None]


def _two_channel_gate(score, ape, start: int, count: int, width: int) -> np.ndarray:
    p, source = _grid(range(start, start + count), 2 * width)
    return (score(p, source // width, source % width) - ape(p % R4, source)).astype(np.float32)[None]


def _r4_step(start: int, count: int) -> StepPlan:
    p = np.arange(start, start + count, dtype=np.int64)[:, None, None]
    heads = np.arange(INDEX_HEADS, dtype=np.int64)[None, :, None]
    dims = np.arange(INDEX_DIM, dtype=np.int64)[None, None, :]
    query_p, query_d = _grid(range(start, start + count), HEAD_DIM)
    return StepPlan(
        start=start,
        fresh={
            "query": r4_query(query_p, query_d).astype(np.float32)[None, :, None, :],
            "compressor_kv": _two_channel(r4_main_value, start, count, HEAD_DIM),
            "compressor_gate": _two_channel_gate(r4_main_score, r4_main_ape, start, count, HEAD_DIM),
            "index_query": r4_index_query(p, heads, dims).astype(np.float32)[None],
            "index_weight": r4_index_weight(p[:, :, 0], heads[:, :, 0]).astype(np.float32)[None],
            "index_compressor_kv": _two_channel(r4_index_value, start, count, INDEX_DIM),
            "index_compressor_gate": _two_channel_gate(
                r4_index_score, r4_index_ape, start, count, INDEX_DIM
            ),
        },
    )


def ratio4_plan(chunks: tuple[tuple[int, int], ...], seed: None = None, stale: float | None = None) -> StreamPlan:
    """Chunks of (start, length); current_kv is always the whole history, as in the seed. With
    ``stale`` the first step gets stale carries of that kv (``stale_carries``), which the contract clears."""
    attrs = base_attrs(
        4, 1, index_num_heads=INDEX_HEADS, index_head_dim=INDEX_DIM, index_topk=TOPK
    )
    slot = np.arange(R4, dtype=np.int64)[:, None]
    main_source = np.arange(2 * HEAD_DIM, dtype=np.int64)[None, :]
    index_source = np.arange(2 * INDEX_DIM, dtype=np.int64)[None, :]
    last = max(start + length for start, length in chunks)
    dense_p, dense_d = _grid(range(last), HEAD_DIM)
    return StreamPlan(
        attrs=attrs,
        output_names=RATIO4_OUTPUTS_6,
        constants={
            "compressor_ape": r4_main_ape(slot, main_source).astype(np.float32),
            "compressor_norm": F(0.72) + _f(np.arange(HEAD_DIM) % 21) * F(0.018),
            "head_sink": np.array([-0.41], dtype=np.float32),
            "index_compressor_ape": r4_index_ape(slot, index_source).astype(np.float32),
            "index_compressor_norm": F(0.81) + _f(np.arange(INDEX_DIM) % 13) * F(0.021),
        },
        kv_history=r4_dense(dense_p, dense_d).astype(np.float32)[None],
        initial_state=empty_state(attrs, 1) if stale is None else stale_carries(empty_state(attrs, 1), stale),
        steps=[_r4_step(start, length) for start, length in chunks],
    )


def recipes(suite: str, seed: int) -> list[Recipe]:
    """The five streams of the two seed tests, identical in every suite and for every seed."""
    def recipe(name: str, description: str, build) -> Recipe:
        return Recipe(f"{FAMILY}.{name}", FAMILY, None, description, build)

    decode_window = 128
    return [
        recipe(
            "r128-stream-to-257",
            "ratio 128 fp8: block 0 prefill, prefill 128..253 (S=126, whole history), then "
            "decodes at 254, 255, 256 with a 128-row window; record 1 is the seed's pinned record",
            partial(
                ratio128_plan,
                ((0, 128, None), (128, 126, None))
                + tuple((position, 1, decode_window) for position in (254, 255, 256)),
            ),
        ),
        recipe(
            "r128-full-recompute-257",
            "ratio 128 fp8: block 0 prefill, then one prefill of 128..256 (S=129); its last "
            "three Y rows, cache and carry equal the decode stream's",
            partial(ratio128_plan, ((0, 128, None), (128, 129, None))),
        ),
        recipe(
            "r4-prefill-16",
            "ratio 4, 2 index heads, top-2: one prefill of 16 positions",
            partial(ratio4_plan, ((0, 16),)),
        ),
        recipe(
            "r4-prefill-8",
            "ratio 4, 2 index heads, top-2: one prefill of 8 positions, sent stale carries (kv 1, score 0), "
            "which the contract clears",
            partial(ratio4_plan, ((0, 8),), stale=1.0),
        ),
        recipe(
            "r4-stream-6-to-16",
            "ratio 4, 2 index heads, top-2: prefill of 6, then decodes 6..15; step 2 equals the "
            "prefill-8 case's last row, step 10 the prefill-16 case's",
            partial(ratio4_plan, ((0, 6),) + tuple((position, 1) for position in range(6, 16))),
        ),
    ]
