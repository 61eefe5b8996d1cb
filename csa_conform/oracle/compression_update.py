"""Stage 1, compression_update: stream new positions into the attention carry
and emit finalized hybrid FP8/BF16 (or f32) records at block ends."""

from __future__ import annotations

import numpy as np

from csa_conform.contract import StepGeometry
from csa_conform.numerics.records import decode_fp8_record
from csa_conform.oracle.compressor import (
    pool_and_finalize,
    reset_carry,
    stream_block_compressor,
    stream_overlap_compressor,
)
from csa_conform.oracle.pooling import finalize_attention_records


def compression_update(
    geometry: StepGeometry,
    compressor_kv: np.ndarray,
    compressor_gate: np.ndarray,
    compressor_ape: np.ndarray,
    compressor_norm: np.ndarray,
    past_compressed_kv: np.ndarray,
    past_compression_carry: np.ndarray,
) -> dict[str, np.ndarray]:
    carry = np.array(past_compression_carry, dtype=np.float32)
    if geometry.start == 0:
        reset_carry(carry)
    ape_rows = (geometry.start + np.arange(geometry.sequence)) % compressor_ape.shape[0]
    with np.errstate(over="ignore"):
        scores = compressor_gate + compressor_ape[ape_rows]
    if geometry.ratio == 4:
        candidates, block_starts = stream_overlap_compressor(carry, compressor_kv, scores, geometry.start)
        prefix = "ratio-4 "
    else:
        candidates, block_starts = stream_block_compressor(
            carry, compressor_kv, scores, geometry.start, geometry.ratio
        )
        prefix = ""

    def finalize(pooled, positions):
        return finalize_attention_records(pooled, compressor_norm, positions, geometry.rope_dim)

    logical, packed = pool_and_finalize(candidates, block_starts, finalize, prefix)
    if geometry.cache_format == "f32":
        past_logical = np.asarray(past_compressed_kv, dtype=np.float32)
        present = np.concatenate([past_logical, logical], axis=1)
        return {
            "present_compressed_kv": present,
            "present_compression_carry": carry,
            "logical_records": present.copy(),
        }
    past_logical = decode_fp8_record(past_compressed_kv)
    return {
        "present_compressed_kv": np.concatenate([past_compressed_kv, packed], axis=1),
        "present_compression_carry": carry,
        "logical_records": np.concatenate([past_logical, logical], axis=1),
    }
