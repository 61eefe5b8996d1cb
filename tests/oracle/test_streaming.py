"""Incremental decode equals full recompute (the seed's streaming guarantee).

A stream fed one position at a time — each step's present_* becoming the
next step's past_* — must reproduce, bit for bit, the rows and the final state
of one prefill over the same positions, across every block boundary, with
batch 2.
"""

from __future__ import annotations

import numpy as np
import pytest

from csa_conform.compare.testing import assert_bits_equal
from csa_conform.golden.recipes.stream import StepPlan, StreamPlan, empty_state, play
from csa_conform.oracle import run_step

BASE_ATTRS = {"head_dim": 512, "qk_rope_head_dim": 64, "causal": 1, "cache_layout_version": 1, "index_layout_version": 1}
RATIO128_OUTPUTS = ("Y", "present_compressed_kv", "present_compression_carry")
RATIO4_OUTPUTS = RATIO128_OUTPUTS + ("present_index_key", "present_index_carry", "selected_indices")


def stream_data(rng, attrs, batch, total):
    """Per-position rows for the whole stream, plus the shared constants."""
    heads, ratio = attrs["num_heads"], attrs["compression_ratio"]
    width = 512 if ratio == 128 else 1024
    f32 = np.float32
    rows = {
        "query": rng.standard_normal((batch, total, heads, 512), dtype=f32),
        "compressor_kv": rng.standard_normal((batch, total, width), dtype=f32),
        "compressor_gate": rng.standard_normal((batch, total, width), dtype=f32),
    }
    constants = {
        "compressor_ape": rng.standard_normal((ratio if ratio == 128 else 4, width), dtype=f32) * f32(0.2),
        "compressor_norm": rng.uniform(0.5, 1.5, 512).astype(f32),
        "head_sink": rng.standard_normal(heads, dtype=f32),
    }
    if ratio == 4:
        index_heads = attrs["index_num_heads"]
        rows["index_query"] = rng.standard_normal((batch, total, index_heads, 128), dtype=f32)
        rows["index_query"][..., :64] += f32(1)
        rows["index_weight"] = rng.uniform(0.5, 1.5, (batch, total, index_heads)).astype(f32)
        rows["index_compressor_kv"] = rng.standard_normal((batch, total, 256), dtype=f32)
        rows["index_compressor_kv"][..., :64] += f32(1)
        rows["index_compressor_kv"][..., 128:192] += f32(1)
        rows["index_compressor_gate"] = rng.standard_normal((batch, total, 256), dtype=f32)
        constants["index_compressor_ape"] = rng.standard_normal((4, 256), dtype=f32) * f32(0.2)
        constants["index_compressor_norm"] = rng.uniform(0.5, 1.5, 128).astype(f32)
    kv_history = rng.standard_normal((batch, total, 512), dtype=f32)
    return rows, constants, kv_history


def plan(attrs, outputs, rows, constants, kv_history, chunks, window):
    steps = [
        StepPlan(start, {name: value[:, start : start + count] for name, value in rows.items()}, window(start + count))
        for start, count in chunks
    ]
    return StreamPlan(attrs, outputs, constants, kv_history, empty_state(attrs, kv_history.shape[0]), steps)


def assert_same_bits(actual, expected, what):
    assert_bits_equal(actual, expected, what)


def check_incremental_equals_full(attrs, outputs, total, prefill, seed):
    rng = np.random.default_rng(seed)
    rows, constants, kv_history = stream_data(rng, attrs, 2, total)
    decode_chunks = [(0, prefill)] + [(position, 1) for position in range(prefill, total)]
    incremental = play(plan(attrs, outputs, rows, constants, kv_history, decode_chunks, lambda t: min(t, 128)), run_step)
    full = play(plan(attrs, outputs, rows, constants, kv_history, [(0, total)], lambda t: None), run_step)[0]
    for step, golden in enumerate(incremental[1:]):
        position = prefill + step
        assert_same_bits(golden.outputs["Y"], full.outputs["Y"][:, position : position + 1], f"Y at {position}")
        if "selected_indices" in outputs:
            width = golden.outputs["selected_indices"].shape[-1]
            full_row = full.outputs["selected_indices"][:, :, position : position + 1]
            assert_same_bits(golden.outputs["selected_indices"], full_row[..., :width], f"selection at {position}")
            assert (full_row[..., width:] == -1).all()
    last = incremental[-1]
    for name in outputs[1:]:
        if name != "selected_indices":
            assert_same_bits(last.outputs[name], full.outputs[name], name)


@pytest.mark.parametrize("cache_format", ["f32", "fp8_e4m3_block64"])
def test_ratio128_incremental_decode_equals_full_recompute(cache_format):
    attrs = dict(BASE_ATTRS, num_heads=2, compression_ratio=128, cache_format=cache_format)
    check_incremental_equals_full(attrs, RATIO128_OUTPUTS, total=260, prefill=125, seed=1)


def test_ratio4_incremental_decode_equals_full_recompute():
    attrs = dict(
        BASE_ATTRS, num_heads=2, compression_ratio=4, cache_format="fp8_e4m3_block64",
        index_num_heads=2, index_head_dim=128, index_topk=3,
    )
    check_incremental_equals_full(attrs, RATIO4_OUTPUTS, total=23, prefill=5, seed=2)
