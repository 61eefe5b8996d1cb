"""The numba engine's versions of the hot stages: same signatures, outputs and errors as the NumPy stages.

Only the dot products, value sums and the softmax's expf move into compiled
kernels (expf: compiled_libm's port of glibc's); candidate rows, masks, the softmax itself and every error come from
the NumPy stage modules, so the two engines share all but the loops.
"""

from __future__ import annotations

import numpy as np

from csa_conform.contract import StepGeometry
from csa_conform.oracle.compiled_kernels import attention_scores, attention_values, index_scores
from csa_conform.oracle.compiled_libm import expf_array
from csa_conform.oracle.index_scoring import causal_records, head_weight_scale, masked_scores
from csa_conform.oracle.parallel import map_chunks, query_chunks
from csa_conform.oracle.sparse_sink_softmax_attention import (
    candidate_rows,
    raise_first_invalid,
    softmax_with_sink,
)

# Query chunks hold this many softmax elements: the expf port's temporaries
# stay in cache while per-chunk Python overhead stays small.
SOFTMAX_CHUNK_ELEMENTS = 1 << 18


def index_scoring(geometry: StepGeometry, transformed, logical_keys, index_weight, row_limit: int | None):
    batch, sequence, heads, width = transformed.shape
    records = logical_keys.shape[1]
    weight_scale = head_weight_scale(width, heads)
    causal = causal_records(geometry)
    keys = np.ascontiguousarray(np.swapaxes(logical_keys, 1, 2), dtype=np.float32)
    scores = np.full((batch, sequence, records), -np.inf, dtype=np.float32)

    def score_chunk(chunk: slice) -> None:
        index_scores(transformed, keys, index_weight, weight_scale, causal, chunk.start, chunk.stop, scores)

    map_chunks(score_chunk, query_chunks(sequence, records * batch * heads))
    return masked_scores(geometry, scores, row_limit)


def sparse_sink_softmax_attention(
    geometry: StepGeometry,
    query: np.ndarray,
    current_kv: np.ndarray,
    logical_records: np.ndarray,
    candidates: np.ndarray,
    head_sink: np.ndarray,
    bias: np.ndarray | None,
) -> dict[str, np.ndarray]:
    batch, sequence, heads, _ = query.shape
    source, rows = candidate_rows(geometry, current_kv, logical_records, candidates)
    empty_row = source.shape[1] - 1
    count = candidates.shape[-1]
    scores = np.empty((batch, sequence, heads, count), dtype=np.float32)
    output = np.empty(query.shape, dtype=np.float32)
    has_bias = bias is not None
    bias_values = bias if has_bias else np.zeros((1, 1, 1, 1), dtype=np.float32)

    def attend(chunk: slice):
        begin, end = chunk.start, chunk.stop
        attention_scores(query, source, rows, empty_row, geometry.scale, bias_values, has_bias, begin, end, scores)
        probabilities, failure = softmax_with_sink(scores[:, chunk], head_sink, begin, expf_array)
        attention_values(probabilities, source, rows, empty_row, begin, end, output)
        return failure

    per_query = count * batch * heads
    raise_first_invalid(geometry, map_chunks(attend, query_chunks(sequence, per_query, SOFTMAX_CHUNK_ELEMENTS)))
    return {"scores": scores, "Y": output}

