"""Numba kernels for the numba engine's record and index-query finalization.

Compressor pooling, bf16 rounding, RMSNorm, the compressed RoPE, the
Hadamard butterfly and the E8M0-scaled FP8/FP4 block quantizers, one record
or query row at a time, with the NumPy modules' binary32 operations in their
order (csa_conform.numerics, csa_conform.oracle.pooling) and glibc's libm
from compiled_libm. Every kernel settles only the all-finite case: whatever
the reference would reject, and anything non-finite on the way (where NaN
payloads could depend on operand order), makes it return False, and the
caller hands the whole call to the NumPy stage code, which decides the
result or the error.
"""

from __future__ import annotations

from functools import cache

import numpy as np
from numba import njit

from csa_conform.numerics.e8m0 import BIAS, E8M0_TABLE, MAX_BYTE, MIN_BYTE
from csa_conform.numerics.fp4 import AMAX_FLOOR as FP4_AMAX_FLOOR
from csa_conform.numerics.fp4 import E2M1_MAX, E2M1_TABLE, FP4_BLOCK
from csa_conform.numerics.fp8 import AMAX_FLOOR as FP8_AMAX_FLOOR
from csa_conform.numerics.fp8 import E4M3_MAX, E4M3_TABLE, FP8_BLOCK
from csa_conform.numerics.records import FP4_BLOCKS, HEAD_DIM, INDEX_DIM
from csa_conform.numerics.rope import rope_frequencies
from csa_conform.oracle.compiled.dots import KERNEL_OPTIONS, decode_fp8_row
from csa_conform.oracle.compiled.libm_kernels import cosf, expf, float32_bits, float32_from_bits, log2f, sinf
from csa_conform.oracle.compiled.parallel import even_parts, map_chunks, worker_count
from csa_conform.oracle.pooling import RMS_EPSILON

_U64 = np.uint64
# Record counts from which a decode splits over the cores (below it a thread pool costs more than it saves).
SPLIT_DECODE_RECORDS = 1024
_ZERO = np.float32(0)
_ONE = np.float32(1)
_MINUS_INFINITY = np.float32(-np.inf)
_E4M3_SUBNORMAL_LIMIT = np.float32(2.0**-6)
_E4M3_SUBNORMAL_STEPS = np.float32(512.0)
# e2m1_encode's midpoints: magnitude code k + 1 starts above (or, for an even code k + 1, at) the k-th
_E2M1_ABOVE = (np.float32(0.25), np.float32(1.25), np.float32(2.5), np.float32(5.0))
_E2M1_AT = (np.float32(0.75), np.float32(1.75), np.float32(3.5))


@cache
def frequency_table(rope_dim: int) -> np.ndarray:
    """rope_frequencies(rope_dim) of the reference numerics, read-only: it depends on nothing else."""
    table = rope_frequencies(rope_dim)
    table.flags.writeable = False
    return table


@njit(**KERNEL_OPTIONS)
def bf16_bits(x):
    """numerics.bf16.bf16_bits of one binary32 (round to nearest even; a NaN is quieted)."""
    bits = float32_bits(x)
    if (bits & _U64(0x7FFFFFFF)) > _U64(0x7F800000):
        return np.uint16((bits >> _U64(16)) | _U64(0x40))
    return np.uint16((bits + _U64(0x7FFF) + ((bits >> _U64(16)) & _U64(1))) >> _U64(16))


@njit(**KERNEL_OPTIONS)
def bf16_round(x):
    return float32_from_bits(_U64(bf16_bits(x)) << _U64(16))


@njit(**KERNEL_OPTIONS)
def _rope_angles(position, frequencies, sines, cosines):
    """sinf and cosf of float32(position) * frequency, for every pair."""
    where = np.float32(position)
    for j in range(frequencies.size):
        angle = where * frequencies[j]
        sines[j] = sinf(angle)
        cosines[j] = cosf(angle)


@njit(**KERNEL_OPTIONS)
def _rotate(tail, sines, cosines):
    """compressed_rope of one tail in place: each pair a*b ± c*d in binary32, then bf16. False if non-finite."""
    for j in range(sines.size):
        real, imaginary = tail[2 * j], tail[2 * j + 1]
        first = bf16_round(real * cosines[j] - imaginary * sines[j])
        second = bf16_round(real * sines[j] + imaginary * cosines[j])
        if not (np.isfinite(first) and np.isfinite(second)):
            return False
        tail[2 * j], tail[2 * j + 1] = first, second
    return True


@njit(**KERNEL_OPTIONS)
def _rms_normalize(pooled, norm, out):
    """pooling.rms_normalize of one record into out; False where the reference rejects it or a value is non-finite."""
    square_sum = _ZERO
    for d in range(pooled.size):
        value = bf16_round(pooled[d])
        out[d] = value
        square_sum += value * value
    if not np.isfinite(square_sum):
        return False
    inverse_rms = _ONE / np.sqrt(square_sum / np.float32(pooled.size) + RMS_EPSILON)
    for d in range(out.size):
        value = bf16_round(out[d] * inverse_rms * norm[d])
        if not np.isfinite(value):
            return False
        out[d] = value
    return True


@njit(**KERNEL_OPTIONS)
def _hadamard_bf16(values):
    """hadamard_bf16 of one row in place (width a power of two)."""
    width = values.size
    span = 1
    while span < width:
        for begin in range(0, width, 2 * span):
            for i in range(begin, begin + span):
                left, right = values[i], values[i + span]
                values[i] = left + right
                values[i + span] = left - right
        span *= 2
    scale = _ONE / np.sqrt(np.float32(width))
    for i in range(width):
        values[i] = bf16_round(values[i] * scale)


@njit(**KERNEL_OPTIONS)
def _e4m3_code(value):
    bits = float32_bits(value)
    sign = (bits >> _U64(24)) & _U64(0x80)
    magnitude = abs(value)
    if magnitude < _E4M3_SUBNORMAL_LIMIT:
        code = np.int64(np.rint(magnitude * _E4M3_SUBNORMAL_STEPS))
    else:
        magnitude_bits = np.int64(float32_bits(magnitude))
        code = ((magnitude_bits + 0x7FFFF + ((magnitude_bits >> 20) & 1)) >> 20) - (120 << 3)
    return np.uint8(sign | _U64(code & 0xFF))


@njit(**KERNEL_OPTIONS)
def _e2m1_code(value):
    magnitude = abs(value)
    code = 0
    for threshold in _E2M1_ABOVE:
        code += magnitude > threshold
    for threshold in _E2M1_AT:
        code += magnitude >= threshold
    if code != 0 and float32_bits(value) >> _U64(31):
        code |= 8
    return np.uint8(code)


@njit(**KERNEL_OPTIONS)
def _quantize_block(block, target_max, amax_floor, fp8, codes, dequantized):
    """blockscale.quantize_blocks of one block: the scale byte, or -1 where the reference rejects it."""
    amax = amax_floor
    for value in block:
        if not np.isfinite(value):
            return -1
        amax = max(amax, abs(value))
    power = np.int64(np.ceil(log2f(amax / target_max)))
    if not MIN_BYTE <= power + BIAS <= MAX_BYTE:
        return -1
    scale = float32_from_bits(_U64(power + BIAS) << _U64(23))
    for i in range(block.size):
        normalized = min(max(block[i] / scale, -target_max), target_max)
        if fp8:
            code = _e4m3_code(normalized)
            decoded = E4M3_TABLE[code]
        else:
            code = _e2m1_code(normalized)
            decoded = E2M1_TABLE[code]
        value = decoded * scale
        if not np.isfinite(value):
            return -1
        codes[i] = code
        dequantized[i] = value
    return power + BIAS


@njit(**KERNEL_OPTIONS)
def _fp4_round_trip(values, scale_bytes, codes):
    """fp4_round_trip of one row in place (values become the dequantized ones). False where rejected."""
    for block in range(values.size // FP4_BLOCK):
        piece = values[block * FP4_BLOCK : (block + 1) * FP4_BLOCK]
        scale = _quantize_block(
            piece, E2M1_MAX, FP4_AMAX_FLOOR, False, codes[block * FP4_BLOCK : (block + 1) * FP4_BLOCK], piece
        )
        if scale < 0:
            return False
        scale_bytes[block] = scale
    return True


@njit(**KERNEL_OPTIONS)
def _softmax_pool(values, scores, pooled):
    """pooling.softmax_pool of one record's candidates [K, W]; False where the reference rejects it."""
    for d in range(pooled.size):
        maximum = _MINUS_INFINITY
        for k in range(scores.shape[0]):
            score = scores[k, d]
            if score > maximum:
                maximum = score
        if not np.isfinite(maximum):
            return False
        numerator = _ZERO
        denominator = _ZERO
        for k in range(scores.shape[0]):
            score = scores[k, d]
            weight = _ZERO if score == _MINUS_INFINITY else expf(score - maximum)
            numerator += weight * values[k, d]
            denominator += weight
        if denominator == 0 or not (np.isfinite(denominator) and np.isfinite(numerator)):
            return False
        pooled[d] = numerator / denominator
    return True


@njit(**KERNEL_OPTIONS)
def _pooled_record(candidates, norm, sines, cosines, pooled, record):
    """A compressed record before its codec: pooled over candidates [K, 2, W], RMS-normalized, its tail
    rotated; False where the reference rejects it."""
    rope_start = record.size - 2 * sines.size
    return (_softmax_pool(candidates[:, 0], candidates[:, 1], pooled) and _rms_normalize(pooled, norm, record)
            and _rotate(record[rope_start:], sines, cosines))


@njit(**KERNEL_OPTIONS)
def index_queries(rows, positions, frequencies, out):
    """finalize_index_query of rows[p, head] at positions[p] into out; False if any row needs the reference."""
    heads, width = rows.shape[1], rows.shape[2]
    tail = width - 2 * frequencies.size
    sines = np.empty(frequencies.size, dtype=np.float32)
    cosines = np.empty(frequencies.size, dtype=np.float32)
    scale_bytes = np.empty(width // FP4_BLOCK, dtype=np.uint8)
    codes = np.empty(width, dtype=np.uint8)
    for p in range(rows.shape[0]):
        _rope_angles(positions[p], frequencies, sines, cosines)
        for h in range(heads):
            values = out[p, h]
            for d in range(width):
                values[d] = bf16_round(rows[p, h, d])
            if not _rotate(values[tail:], sines, cosines):
                return False
            _hadamard_bf16(values)
            if not _fp4_round_trip(values, scale_bytes, codes):
                return False
    return True


@njit(**KERNEL_OPTIONS)
def attention_records(candidates, block_starts, norm, frequencies, logical, packed):
    """finalize_attention_records(softmax_pool(candidates)) into logical [B, R, 512] and packed [B, R, 583]."""
    batch, records, _, _, width = candidates.shape
    rope_dim = 2 * frequencies.size
    lead = width - rope_dim
    sines = np.empty(frequencies.size, dtype=np.float32)
    cosines = np.empty(frequencies.size, dtype=np.float32)
    pooled = np.empty(width, dtype=np.float32)
    codes = np.empty(FP8_BLOCK, dtype=np.uint8)
    for r in range(records):
        _rope_angles(block_starts[r], frequencies, sines, cosines)
        for b in range(batch):
            record = logical[b, r]
            if not _pooled_record(candidates[b, r], norm, sines, cosines, pooled, record):
                return False
            out = packed[b, r]
            for block in range(lead // FP8_BLOCK):
                piece = record[block * FP8_BLOCK : (block + 1) * FP8_BLOCK]
                scale = _quantize_block(piece, E4M3_MAX, FP8_AMAX_FLOOR, True, codes, piece)
                if scale < 0:
                    return False
                at = block * (FP8_BLOCK + 1)
                out[at] = scale
                out[at + 1 : at + 1 + FP8_BLOCK] = codes
            at = (lead // FP8_BLOCK) * (FP8_BLOCK + 1)
            for d in range(rope_dim):
                bits = bf16_bits(record[lead + d])
                out[at + 2 * d] = bits & 0xFF
                out[at + 2 * d + 1] = bits >> 8
    return True


@njit(**KERNEL_OPTIONS)
def index_records(candidates, block_starts, norm, frequencies, logical, packed):
    """finalize_index_records(softmax_pool(candidates)) into logical [B, R, 128] and packed [B, R, 68]."""
    batch, records, _, _, width = candidates.shape
    sines = np.empty(frequencies.size, dtype=np.float32)
    cosines = np.empty(frequencies.size, dtype=np.float32)
    pooled = np.empty(width, dtype=np.float32)
    scale_bytes = np.empty(width // FP4_BLOCK, dtype=np.uint8)
    codes = np.empty(width, dtype=np.uint8)
    for r in range(records):
        _rope_angles(block_starts[r], frequencies, sines, cosines)
        for b in range(batch):
            record = logical[b, r]
            if not _pooled_record(candidates[b, r], norm, sines, cosines, pooled, record):
                return False
            _hadamard_bf16(record)
            if not _fp4_round_trip(record, scale_bytes, codes):
                return False
            out = packed[b, r]
            for block in range(width // FP4_BLOCK):
                at = block * (FP4_BLOCK // 2 + 1)
                out[at] = scale_bytes[block]
                for i in range(FP4_BLOCK // 2):
                    out[at + 1 + i] = codes[block * FP4_BLOCK + 2 * i] | (codes[block * FP4_BLOCK + 2 * i + 1] << 4)
    return True


@njit(**KERNEL_OPTIONS)
def _decode_fp8_records(records, out):
    """decode_fp8_record of records [N, 583] into out [N, 512]."""
    for n in range(records.shape[0]):
        decode_fp8_row(records[n], out[n], 0, out.shape[-1])


@njit(**KERNEL_OPTIONS)
def _decode_fp4_records(records, out):
    """decode_fp4_record of records [N, 68] into out [N, 128]."""
    for n in range(records.shape[0]):
        record, logical = records[n], out[n]
        for block in range(FP4_BLOCKS):
            at = block * (FP4_BLOCK // 2 + 1)
            scale = E8M0_TABLE[record[at]]
            for i in range(FP4_BLOCK // 2):
                pair = record[at + 1 + i]
                logical[block * FP4_BLOCK + 2 * i] = E2M1_TABLE[pair & 0x0F] * scale
                logical[block * FP4_BLOCK + 2 * i + 1] = E2M1_TABLE[pair >> 4] * scale


def decode_fp8_record(records) -> np.ndarray:
    """records.decode_fp8_record, compiled: products of table values, which no operand order can change."""
    return _decoded(_decode_fp8_records, records, HEAD_DIM)


def decode_fp4_record(records) -> np.ndarray:
    """records.decode_fp4_record, compiled."""
    return _decoded(_decode_fp4_records, records, INDEX_DIM)


def _decoded(kernel, records, width: int) -> np.ndarray:
    """Records decoded in row ranges over the cores once there are enough (a ratio-128 decode at
    2^20 decodes its 8,192 records every step); each record is decoded alone, so the split cannot show."""
    records = np.ascontiguousarray(records, dtype=np.uint8)
    out = np.empty(records.shape[:-1] + (width,), dtype=np.float32)
    flat, decoded = records.reshape(-1, records.shape[-1]), out.reshape(-1, width)
    parts = worker_count() if flat.shape[0] >= SPLIT_DECODE_RECORDS else 1
    map_chunks(lambda rows: kernel(flat[rows], decoded[rows]), even_parts(flat.shape[0], parts))
    return out


KERNELS = (
    bf16_bits, bf16_round, _rope_angles, _rotate, _rms_normalize, _hadamard_bf16, _e4m3_code, _e2m1_code,
    _quantize_block, _fp4_round_trip, _softmax_pool, _pooled_record, index_queries, attention_records, index_records,
    _decode_fp8_records, _decode_fp4_records,
)
