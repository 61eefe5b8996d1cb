"""Wall-clock of `run_step` at production shapes (best of 3), with peak memory.

Run by hand (`make bench`), never asserted in tests. Targets on the 2-core CI
machine (2x the compiled single-threaded Rust reference): (a) 1.8 s,
(b) 0.55 s, (c) 0.05 s.
"""

from __future__ import annotations

import resource
import time

import numpy as np

from csa_conform.contract import validate_step
from csa_conform.oracle import run_step
from csa_conform.oracle.compression_update import compression_update
from csa_conform.oracle.index_key_update import index_key_update

RATIO128_FP8 = {
    "head_dim": 512, "qk_rope_head_dim": 64, "compression_ratio": 128, "causal": 1,
    "cache_layout_version": 1, "index_layout_version": 1, "cache_format": "fp8_e4m3_block64",
}
RATIO4 = dict(RATIO128_FP8, compression_ratio=4)
INDEX_OFFSET = 1.0
MAIN_SOURCES = (
    "compressor_kv", "compressor_gate", "compressor_ape", "compressor_norm",
    "past_compressed_kv", "past_compression_carry",
)
INDEX_SOURCES = tuple("index_" + name for name in MAIN_SOURCES[:4]) + ("past_index_key", "past_index_carry")


def step_inputs(rng, attrs, batch, sequence, total, current_kv_len):
    """Random inputs for a fresh prefill (past state empty, carry reset).

    Index queries and keys carry a positive offset on their first 64 dims, so
    scores are positive sums over heads; exact ties then stay rare at S=256.
    """
    ratio, heads = attrs["compression_ratio"], attrs["num_heads"]
    width = 512 if ratio == 128 else 1024
    f32 = np.float32
    inputs = {
        "query": rng.standard_normal((batch, sequence, heads, 512), dtype=f32),
        "current_kv": rng.standard_normal((batch, current_kv_len, 512), dtype=f32),
        "compressor_kv": rng.standard_normal((batch, sequence, width), dtype=f32),
        "compressor_gate": rng.standard_normal((batch, sequence, width), dtype=f32),
        "compressor_ape": rng.standard_normal((ratio if ratio == 128 else 4, width), dtype=f32) * f32(0.1),
        "compressor_norm": f32(1) + rng.standard_normal(512, dtype=f32) * f32(0.1),
        "past_compressed_kv": np.zeros((batch, 0, 583), dtype=np.uint8),
        "past_compression_carry": np.zeros((batch, 128 if ratio == 128 else 8, 2, width), dtype=f32),
        "seqlens_k": np.full(batch, total - 1, dtype=np.int32),
        "total_sequence_length": np.array(total, dtype=np.int64),
        "head_sink": rng.standard_normal(heads, dtype=f32),
    }
    if ratio == 4:
        index_heads = attrs["index_num_heads"]
        index_query = rng.standard_normal((batch, sequence, index_heads, 128), dtype=f32)
        index_query[..., :64] += f32(INDEX_OFFSET)
        index_kv = rng.standard_normal((batch, sequence, 256), dtype=f32)
        index_kv[..., :64] += f32(INDEX_OFFSET)
        index_kv[..., 128:192] += f32(INDEX_OFFSET)
        inputs.update(
            index_query=index_query,
            index_weight=rng.uniform(0.5, 1.5, (batch, sequence, index_heads)).astype(f32),
            index_compressor_kv=index_kv,
            index_compressor_gate=rng.standard_normal((batch, sequence, 256), dtype=f32),
            index_compressor_ape=rng.standard_normal((4, 256), dtype=f32) * f32(0.1),
            index_compressor_norm=f32(1) + rng.standard_normal(128, dtype=f32) * f32(0.1),
            past_index_key=np.zeros((batch, 0, 68), dtype=np.uint8),
            past_index_carry=np.zeros((batch, 8, 2, 256), dtype=f32),
        )
    return inputs


def prefill_state(attrs, prefill, outputs) -> dict:
    """The present_* a prefill leaves behind, from the compression stages alone.

    A 2047-row prefill scores ~9e7 record pairs per step; binary32 sums that
    dense collide exactly somewhere, and the reference rejects such a step.
    The state does not depend on scoring, so the compressors build it.
    """
    geometry = validate_step(attrs, prefill, outputs)
    main = compression_update(geometry, *(prefill[name] for name in MAIN_SOURCES))
    index = index_key_update(geometry, *(prefill[name] for name in INDEX_SOURCES))
    return {
        "past_compressed_kv": main["present_compressed_kv"],
        "past_compression_carry": main["present_compression_carry"],
        "past_index_key": index["present_index_key"],
        "past_index_carry": index["present_index_carry"],
    }


def decode_inputs(rng, attrs, prefill, state, total):
    """One decode step continuing `prefill` from its state."""
    step = step_inputs(rng, attrs, 1, 1, total, 128)
    step["current_kv"] = np.concatenate([prefill["current_kv"], step["current_kv"][:, :1]], axis=1)[:, -128:]
    for name in ("compressor_ape", "compressor_norm", "head_sink", "index_compressor_ape", "index_compressor_norm"):
        step[name] = prefill[name]
    step.update(state)
    return step


def best_of_three(attrs, inputs, outputs) -> float:
    times = []
    for _ in range(3):
        begin = time.perf_counter()
        run_step(attrs, inputs, outputs)
        times.append(time.perf_counter() - begin)
    return min(times)


def main() -> None:
    rng = np.random.default_rng(0)
    three = ["Y", "present_compressed_kv", "present_compression_carry"]
    six = three + ["present_index_key", "present_index_carry", "selected_indices"]

    attrs_a = dict(RATIO128_FP8, num_heads=16)
    case_a = step_inputs(rng, attrs_a, 1, 1024, 1024, 1024)
    print(f"(a) ratio-128 fp8 prefill B=1 S=1024 N=16 Kc=1024: {best_of_three(attrs_a, case_a, three):.3f} s (target 1.8)")

    attrs_b = dict(RATIO4, num_heads=16, index_num_heads=16, index_head_dim=128, index_topk=512)
    case_b = step_inputs(rng, attrs_b, 1, 256, 256, 256)
    print(f"(b) ratio-4 prefill B=1 S=256 N=16 I=16 k=512:      {best_of_three(attrs_b, case_b, six):.3f} s (target 0.55)")

    attrs_c = dict(RATIO4, num_heads=64, index_num_heads=64, index_head_dim=128, index_topk=512)
    prefill = step_inputs(rng, attrs_c, 1, 2047, 2047, 2047)
    case_c = decode_inputs(rng, attrs_c, prefill, prefill_state(attrs_c, prefill, six), 2048)
    print(f"(c) ratio-4 decode T=2048 N=64 I=64 k=512:          {best_of_three(attrs_c, case_c, six):.3f} s (target 0.05)")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak resident memory: {peak:.0f} MiB")


if __name__ == "__main__":
    main()
