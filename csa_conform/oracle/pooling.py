"""Per-dimension softmax pooling of compressor candidates, and record finalization.

Both compressors pool one record per output dimension: max over the candidate
scores (f32::max, so -inf slots never win), then an ascending sum of
glibc-`expf` weights over the finite-or-+inf candidates. Finalization is the
reference's bf16 -> RMSNorm -> compressed RoPE -> FP8 (attention) or
Hadamard -> FP4 (index) chain; the logical record is what the block quantizer
gives back, because that is what attention and scoring read.
"""

from __future__ import annotations

import numpy as np

from csa_conform.errors import ContractError, operator_message
from csa_conform.numerics.bf16 import bf16_round
from csa_conform.numerics.fp8 import FP8_BLOCK, quantize_fp8_blocks
from csa_conform.numerics.hadamard import hadamard_bf16
from csa_conform.numerics.index_query import fp4_round_trip
from csa_conform.numerics.records import pack_fp4_record, pack_fp8_record
from csa_conform.numerics.rope import compressed_rope
from csa_conform.numerics.variant import REFERENCE, Numerics

RMS_EPSILON = np.float32(1.0e-6)
# RMSNorm ported another way (explain's structural hypotheses), by Numerics.rms_norm.
RMS_NORM_PORTS = {
    "sum": "RMSNorm over the root of the square sum, not of its mean (every record 1/sqrt(width) too small)",
    "unweighted": "RMSNorm without its weight (the norm vector left out)",
    "binary64-squares": "RMSNorm's square sum carried in binary64 (exact products) and rounded to binary32 once",
}


def softmax_pool(values: np.ndarray, scores: np.ndarray, numerics: Numerics = REFERENCE):
    """Pool candidates along axis -2 of values/scores[..., K, W].

    Returns (pooled[..., W], no_finite[..., W], invalid[..., W]): the two masks
    say where the reference rejects the record (no finite score; a zero,
    non-finite denominator or non-finite numerator).
    """
    maximum = np.fmax.reduce(scores, axis=-2, initial=-np.inf)
    no_finite = ~np.isfinite(maximum)
    numerator = np.zeros(maximum.shape, dtype=np.float32)
    denominator = np.zeros(maximum.shape, dtype=np.float32)
    pooled_slots = _pooled_candidates(scores.shape[-2], numerics.pool_skipped)
    with np.errstate(invalid="ignore", over="ignore"):
        pooled_scores = scores[..., pooled_slots, :]
        weights = np.where(pooled_scores == -np.inf, np.float32(0),
                           numerics.expf(pooled_scores - maximum[..., None, :]))
        for weight, value in zip(np.moveaxis(weights, -2, 0), np.moveaxis(values[..., pooled_slots, :], -2, 0)):
            numerics.accumulate(numerator, weight, value)
            denominator += weight
        invalid = (denominator == 0) | ~np.isfinite(denominator) | ~np.isfinite(numerator)
        pooled = numerator / denominator
    return pooled, no_finite, invalid


def _pooled_candidates(count: int, skipped: str | None) -> slice:
    """The candidate slots the pooled sums run over: all (the reference), or all but the first or the last."""
    return slice(1 if skipped == "first" else 0, count - 1 if skipped == "last" else count)


def pool_failure(no_finite: np.ndarray, invalid: np.ndarray, prefix: str) -> str | None:
    """The reference's message for the first failing dimension of one record, if any."""
    failing = no_finite | invalid
    if not failing.any():
        return None
    d = int(np.argmax(failing))
    if no_finite[d]:
        return operator_message(f"{prefix}compression block has no finite score for dimension {d}")
    return operator_message(f"{prefix}compression softmax is invalid for dimension {d}")


def rms_normalize(records: np.ndarray, norm: np.ndarray, what: str, numerics: Numerics = REFERENCE) -> np.ndarray:
    """bf16, then sequential-sum RMSNorm with a bf16 rounding of x*inv*w (or a port of RMS_NORM_PORTS)."""
    values = bf16_round(records, numerics)
    numerics.probe("bf16", values)
    if numerics.rms_norm == "binary64-squares":
        square_sum = _binary64_square_sum(values)
    else:
        square_sum = numerics.sum_of_squares(values)
    if not np.isfinite(square_sum).all():
        raise ContractError(operator_message(f"{what}RMSNorm square sum is non-finite"))
    width = np.float32(values.shape[-1])
    port = numerics.rms_norm
    mean_square = square_sum if port == "sum" else square_sum / width
    inverse_rms = np.float32(1) / np.sqrt(mean_square + RMS_EPSILON)
    weight = np.float32(1) if port == "unweighted" else norm
    with np.errstate(over="ignore", invalid="ignore"):
        normalized = bf16_round(values * inverse_rms[..., None] * weight, numerics)
    numerics.probe("rmsnorm", normalized)
    return normalized


def _binary64_square_sum(values: np.ndarray) -> np.ndarray:
    """Σ x*x over the last axis, ascending from +0 in binary64, rounded to binary32 once."""
    total = np.zeros(values.shape[:-1], dtype=np.float64)
    for column in np.moveaxis(values, -1, 0):
        wide = column.astype(np.float64)
        total += wide * wide
    return total.astype(np.float32)


def finalize_attention_records(pooled: np.ndarray, norm: np.ndarray, block_starts: np.ndarray, rope_dim: int,
                               numerics: Numerics = REFERENCE):
    """(logical f32[..., 512], packed u8[..., 583]) of pooled[..., 512] records."""
    record = rms_normalize(pooled, norm, "", numerics)
    non_rope = record.shape[-1] - rope_dim
    record[..., non_rope:] = compressed_rope(record[..., non_rope:], block_starts, numerics)
    numerics.probe("rope", record[..., non_rope:])
    blocks = record[..., :non_rope].reshape(record.shape[:-1] + (non_rope // FP8_BLOCK, FP8_BLOCK))
    scales, codes, dequantized = quantize_fp8_blocks(blocks, numerics)
    numerics.probe("fp8_scale", scales)
    numerics.probe("fp8_codes", codes)
    record[..., :non_rope] = dequantized.reshape(record.shape[:-1] + (non_rope,))
    return record, pack_fp8_record(scales, codes, record[..., non_rope:], numerics)


def finalize_index_records(pooled: np.ndarray, norm: np.ndarray, block_starts: np.ndarray, rope_dim: int,
                           numerics: Numerics = REFERENCE):
    """(logical f32[..., 128], packed u8[..., 68]) of pooled[..., 128] index records."""
    record = rms_normalize(pooled, norm, "index ", numerics)
    width = record.shape[-1]
    record[..., width - rope_dim :] = compressed_rope(record[..., width - rope_dim :], block_starts, numerics)
    numerics.probe("rope", record[..., width - rope_dim :])
    transformed = hadamard_bf16(record, numerics)
    numerics.probe("hadamard", transformed)
    scales, packed, logical = fp4_round_trip(transformed, numerics)
    return logical, pack_fp4_record(scales, packed)
