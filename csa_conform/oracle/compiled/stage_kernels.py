"""The numba engine's versions of the hot stages: same signatures, outputs and errors as the NumPy stages.

Scoring and attention move their dot products, value sums and the softmax
(softmax_kernels.py) into compiled kernels; candidate rows, masks and every
error come from the NumPy stage modules. Compressor pooling with record
finalization, and index-query finalization, run as compiled kernels
(record_kernels.py) that settle only steps the reference accepts with
finite values throughout; any other call goes to the NumPy stage code
whole, so the two engines share every decision about errors.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from csa_conform.contract import StepGeometry
from csa_conform.numerics.e8m0 import E8M0_TABLE
from csa_conform.numerics.fp4 import E2M1_TABLE
from csa_conform.numerics.records import FP4_RECORD_BYTES, FP8_RECORD_BYTES, HEAD_DIM, INDEX_DIM, ROPE_DIM
from csa_conform.oracle import compression_update as reference_compression
from csa_conform.oracle import index_key_update as reference_index_keys
from csa_conform.oracle import index_query_finalize as reference_queries
from csa_conform.oracle.compiled.dots import BLOCK, INDEX_TILE, attention_scores, attention_values, packed_index_scores
from csa_conform.oracle.compiled.parallel import even_parts, map_chunks, query_chunks, worker_count
from csa_conform.oracle.compiled.record_kernels import (
    attention_records,
    decode_fp4_record,
    decode_fp8_record,
    frequency_table,
    index_queries,
    index_records,
)
from csa_conform.oracle.compiled.softmax_kernels import softmax_with_sink
from csa_conform.oracle.compressor import stream
from csa_conform.oracle.index_scoring import causal_records, head_weight_scale, masked_scores
from csa_conform.oracle.payloads import StagePayload
from csa_conform.oracle.sparse_sink_softmax_attention import candidate_records, held_scores, raise_first_invalid

# Query chunks hold this many softmax elements: each chunk's probabilities
# stay in cache while per-chunk Python overhead stays small.
SOFTMAX_CHUNK_ELEMENTS = 1 << 18


def index_scoring(geometry: StepGeometry, transformed, index_keys, index_weight, row_limit: int | None):
    """Scores from the packed keys, in record chunks over the cores: a decode step has one query."""
    batch, sequence, heads, width = transformed.shape
    records = index_keys.shape[1]
    weight_scale = head_weight_scale(width, heads)
    causal = causal_records(geometry)
    keys = np.ascontiguousarray(index_keys, dtype=np.uint8)
    queries = np.ascontiguousarray(transformed, dtype=np.float32)
    weights = np.ascontiguousarray(index_weight, dtype=np.float32)
    scores = np.full((batch, sequence, records), -np.inf, dtype=np.float32)

    def score_chunk(chunk: slice) -> None:
        packed_index_scores(
            queries, keys, E2M1_TABLE, E8M0_TABLE, weights, weight_scale, causal, chunk.start, chunk.stop, scores
        )

    map_chunks(score_chunk, record_chunks(records))
    return masked_scores(geometry, scores, row_limit)


def record_chunks(records: int) -> list[slice]:
    """Whole index tiles, a few chunks per core so that uneven causal rows still balance."""
    tiles = -(-records // INDEX_TILE)
    per_chunk = max(1, -(-tiles // (4 * worker_count())))
    size = per_chunk * INDEX_TILE
    return [slice(begin, min(records, begin + size)) for begin in range(0, records, size)]


def sparse_sink_softmax_attention(
    geometry: StepGeometry,
    query: np.ndarray,
    current_kv: np.ndarray,
    present_compressed_kv: np.ndarray,
    candidates: np.ndarray,
    head_sink: np.ndarray,
    bias: np.ndarray | None,
) -> Mapping[str, np.ndarray]:
    batch, sequence, heads, dim = query.shape
    current = np.ascontiguousarray(current_kv, dtype=np.float32)
    records, rows = candidate_records(geometry, present_compressed_kv, candidates, decode_fp8_record, in_place=True)
    if records.dtype == np.uint8:  # the kernels decode each record as they read it
        packed, records = np.ascontiguousarray(records), np.empty((batch, 0, current.shape[-1]), dtype=np.float32)
    else:
        packed, records = np.empty((batch, 0, FP8_RECORD_BYTES), dtype=np.uint8), np.ascontiguousarray(records)
    count = candidates.shape[-1]
    shape = (batch, sequence, heads, count)
    output = np.empty(query.shape, dtype=np.float32)
    has_bias = bias is not None
    bias_values = bias if has_bias else np.zeros((1, 1, 1, 1), dtype=np.float32)
    query_parts = query_chunks(sequence, count * batch * heads, SOFTMAX_CHUNK_ELEMENTS)
    scores = np.empty(shape, dtype=np.float32) if held_scores(shape) or len(query_parts) == 1 else None

    def score(queries: slice, candidates: slice, target: np.ndarray) -> None:
        attention_scores(query, current, records, packed, rows, geometry.scale, bias_values, has_bias,
                         queries.start, queries.stop, candidates.start, candidates.stop, target)

    def score_chunk(queries: slice) -> np.ndarray:
        """The chunk's scores on their own, [B, chunk, N, C]: the kernel sees the chunk's queries."""
        tile = np.empty((batch, queries.stop - queries.start) + shape[2:], dtype=np.float32)
        chunk_bias = np.ascontiguousarray(bias_values[:, :, queries]) if has_bias else bias_values
        attention_scores(np.ascontiguousarray(query[:, queries]), current, records, packed,
                         np.ascontiguousarray(rows[:, queries]), geometry.scale, chunk_bias, has_bias,
                         0, queries.stop - queries.start, 0, count, tile)
        return tile

    def normalize(queries: slice, head_range: slice, probabilities: np.ndarray, source: np.ndarray, first: int):
        """Softmax of ``source``'s rows for ``queries``; ``source`` holds query ``first`` as its row 0."""
        begin, end = queries.start - first, queries.stop - first
        b, s, h = softmax_with_sink(source, head_sink, begin, end, head_range.start, head_range.stop, probabilities)
        return None if b < 0 else (b, s + first, h)

    def weigh(queries: slice, span: slice, probabilities: np.ndarray) -> None:
        attention_values(probabilities, current, records, packed, rows, queries.start, queries.stop,
                         span.start, span.stop, output)

    def attend(queries: slice):
        probabilities = np.empty((batch, queries.stop - queries.start, heads, count), dtype=np.float32)
        if scores is None:
            failure = normalize(queries, slice(0, heads), probabilities, score_chunk(queries), queries.start)
        else:
            score(queries, slice(0, count), scores)
            failure = normalize(queries, slice(0, heads), probabilities, scores, 0)
        weigh(queries, slice(0, dim), probabilities)
        return failure

    if len(query_parts) > 1 or worker_count() == 1:
        failures = map_chunks(attend, query_parts)
    else:
        # One chunk of queries (a decode): its candidates split over the cores for the scores, its
        # heads for the softmax, then whole BLOCKs of d for the values (each core reads its span of each row).
        (queries,) = query_parts
        probabilities = np.empty(shape, dtype=np.float32)
        map_chunks(lambda candidates: score(queries, candidates, scores), even_parts(count, worker_count()))
        failures = map_chunks(lambda head_range: normalize(queries, head_range, probabilities, scores, 0),
                              even_parts(heads, worker_count()))
        spans = [slice(part.start * BLOCK, min(dim, part.stop * BLOCK))
                 for part in even_parts(-(-dim // BLOCK), worker_count())]
        map_chunks(lambda span: weigh(queries, span, probabilities), spans)
    raise_first_invalid(geometry, failures)
    if scores is not None:
        return {"scores": scores, "Y": output}

    def every_score() -> np.ndarray:
        recomputed = np.empty(shape, dtype=np.float32)
        map_chunks(lambda queries: score(queries, slice(0, count), recomputed), query_parts)
        return recomputed

    return StagePayload({"Y": output}, {"scores": every_score}, order=("scores", "Y"))


def compression_update(
    geometry: StepGeometry, compressor_kv, compressor_gate, compressor_ape, compressor_norm,
    past_compressed_kv, past_compression_carry,
) -> dict[str, np.ndarray]:
    candidates, block_starts, carry = stream(
        geometry, compressor_kv, compressor_gate, compressor_ape, past_compression_carry
    )
    records = None
    if geometry.rope_dim == ROPE_DIM and candidates.shape[-1] == HEAD_DIM:
        records = _compiled_records(
            attention_records, candidates, block_starts, compressor_norm, geometry.rope_dim, FP8_RECORD_BYTES
        )
    if records is None:
        records = reference_compression.attention_records(geometry, candidates, block_starts, compressor_norm)
    return reference_compression.present_compression(
        geometry, past_compressed_kv, *records, carry, decode_fp8_record
    )


def index_key_update(
    geometry: StepGeometry, index_compressor_kv, index_compressor_gate, index_compressor_ape,
    index_compressor_norm, past_index_key, past_index_carry,
) -> dict[str, np.ndarray]:
    candidates, block_starts, carry = stream(
        geometry, index_compressor_kv, index_compressor_gate, index_compressor_ape, past_index_carry
    )
    records = None
    if _rope_fits(geometry.rope_dim, candidates.shape[-1]) and candidates.shape[-1] == INDEX_DIM:
        records = _compiled_records(
            index_records, candidates, block_starts, index_compressor_norm, geometry.rope_dim, FP4_RECORD_BYTES
        )
    if records is None:
        records = reference_index_keys.index_records(geometry, candidates, block_starts, index_compressor_norm)
    return reference_index_keys.present_index_keys(past_index_key, *records, carry, decode_fp4_record)


def _compiled_records(kernel, candidates, block_starts, norm, rope_dim: int, record_bytes: int):
    """(logical, packed) from a compiled_records kernel, or None where the NumPy stage code must decide."""
    if norm.dtype != np.float32:
        return None
    batch, records, width = candidates.shape[0], candidates.shape[1], candidates.shape[-1]
    logical = np.empty((batch, records, width), dtype=np.float32)
    packed = np.empty((batch, records, record_bytes), dtype=np.uint8)
    candidates = np.ascontiguousarray(candidates, dtype=np.float32)
    if kernel(candidates, block_starts, norm, frequency_table(rope_dim), logical, packed):
        return logical, packed
    return None


def index_query_finalize(geometry: StepGeometry, index_query: np.ndarray):
    rows = np.ascontiguousarray(index_query, dtype=np.float32)
    batch, sequence, heads, width = rows.shape
    if not (_rope_fits(geometry.rope_dim, width) and width == INDEX_DIM):
        return reference_queries.index_query_finalize(geometry, index_query)
    rows = rows.reshape(batch * sequence, heads, width)
    positions = np.tile(geometry.start + np.arange(sequence), batch)
    frequencies = frequency_table(geometry.rope_dim)
    transformed = np.empty(rows.shape, dtype=np.float32)

    def finalize_chunk(chunk: slice) -> bool:
        return index_queries(rows[chunk], positions[chunk], frequencies, transformed[chunk])

    if not all(map_chunks(finalize_chunk, query_chunks(rows.shape[0], heads * width))):
        return reference_queries.index_query_finalize(geometry, index_query)
    return {"transformed": transformed.reshape(index_query.shape)}, None


def _rope_fits(rope_dim: int, width: int) -> bool:
    return rope_dim % 2 == 0 and rope_dim <= width
