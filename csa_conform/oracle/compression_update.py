"""Stage 1, compression_update: stream new positions into the attention carry
and emit finalized hybrid FP8/BF16 (or f32) records at block ends."""

from __future__ import annotations

from functools import partial

import numpy as np

from csa_conform.contract import StepGeometry
from csa_conform.numerics.records import decode_fp8_record
from csa_conform.numerics.variant import REFERENCE, Numerics
from csa_conform.oracle.compressor import pool_and_finalize, stream
from csa_conform.oracle.payloads import StagePayload
from csa_conform.oracle.pooling import finalize_attention_records


def compression_update(
    geometry: StepGeometry,
    compressor_kv: np.ndarray,
    compressor_gate: np.ndarray,
    compressor_ape: np.ndarray,
    compressor_norm: np.ndarray,
    past_compressed_kv: np.ndarray,
    past_compression_carry: np.ndarray,
    numerics: Numerics = REFERENCE,
) -> dict[str, np.ndarray]:
    candidates, block_starts, carry = stream(
        geometry, compressor_kv, compressor_gate, compressor_ape, past_compression_carry, numerics
    )
    logical, packed = attention_records(geometry, candidates, block_starts, compressor_norm, numerics)
    return present_compression(geometry, past_compressed_kv, logical, packed, carry)


def attention_records(geometry: StepGeometry, candidates, block_starts, compressor_norm, numerics: Numerics = REFERENCE):
    """(logical, packed) of every record the step emits, or the reference's first failure."""

    def finalize(pooled, positions):
        return finalize_attention_records(pooled, compressor_norm, positions, geometry.rope_dim, numerics)

    prefix = "ratio-4 " if geometry.ratio == 4 else ""
    return pool_and_finalize(candidates, block_starts, finalize, prefix, numerics)


def present_compression(
    geometry: StepGeometry, past_compressed_kv, logical, packed, carry, decode=decode_fp8_record
) -> StagePayload:
    """The stage payload: the step's records appended to the cache, the carry, and every logical
    record, decoded from the present cache (through `decode`, which the numba engine compiles) only
    when read."""
    if geometry.cache_format == "f32":
        present = np.concatenate([np.asarray(past_compressed_kv, dtype=np.float32), logical], axis=1)
        logical_records = present.copy
    else:
        present = np.concatenate([past_compressed_kv, packed], axis=1)
        logical_records = partial(decode, present)
    tensors = {"present_compressed_kv": present, "present_compression_carry": carry}
    return StagePayload(tensors, {"logical_records": logical_records})
