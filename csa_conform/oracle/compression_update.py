"""Stage 1, compression_update: stream new positions into the attention carry
and emit finalized hybrid FP8/BF16 (or f32) records at block ends."""

from __future__ import annotations

import numpy as np

from csa_conform.contract import StepGeometry
from csa_conform.numerics.records import decode_fp8_record
from csa_conform.oracle.compressor import compress
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
    def finalize(pooled, positions):
        return finalize_attention_records(pooled, compressor_norm, positions, geometry.rope_dim)

    prefix = "ratio-4 " if geometry.ratio == 4 else ""
    logical, packed, carry = compress(
        geometry, compressor_kv, compressor_gate, compressor_ape, past_compression_carry, finalize, prefix
    )
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
