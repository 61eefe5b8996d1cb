"""Stage 4 under the official numerics: index scoring as a bf16 einsum.

The official code scores with bf16 tensors: each dot of a transformed query
with an index key accumulates in binary32 (ascending d here) and is rounded to
bf16; the head weight is bf16(bf16(index_weight) * f32(128^-1/2 * I^-1/2));
relu(dot) * weight is a bf16 product; the sum over index heads accumulates in
binary32 (ascending head here) and is rounded to bf16. Scores are therefore
bf16 values, and equal scores are common (selection fixes their order).
Non-causal records are -inf, as in the reference.
"""

from __future__ import annotations

import numpy as np

from csa_conform.contract import StepGeometry
from csa_conform.numerics.bf16 import bf16_round
from csa_conform.oracle.compiled.parallel import map_chunks, query_chunks
from csa_conform.oracle.index_scoring import masked_scores


def official_weight_scale(width: int, heads: int) -> np.float32:
    """128^-1/2 * I^-1/2 as the Python scalar it is (float64), taken to binary32 by the bf16 multiply."""
    return np.float32(width**-0.5 * heads**-0.5)


def head_weights(index_weight: np.ndarray, width: int) -> np.ndarray:
    """bf16 head weights [B,S,I]: the bf16 projection output times the scalar, rounded to bf16."""
    heads = index_weight.shape[-1]
    return bf16_round(bf16_round(index_weight) * official_weight_scale(width, heads))


def official_index_scoring(geometry: StepGeometry, transformed, logical_keys, index_weight, row_limit: int | None):
    """Returns ({"scores": f32[B,S,T/4] holding bf16 values}, first RowFailure or None)."""
    batch, sequence, heads, width = transformed.shape
    records = logical_keys.shape[1]
    keys = np.ascontiguousarray(np.moveaxis(bf16_round(logical_keys), -1, 0))
    weights = head_weights(index_weight, width)
    scores = np.full((batch, sequence, records), -np.inf, dtype=np.float32)

    def score_chunk(chunk: slice) -> None:
        queries = np.ascontiguousarray(np.moveaxis(bf16_round(transformed[:, chunk]), -1, 0))
        dots = np.zeros(queries.shape[1:] + (records,), dtype=np.float32)
        with np.errstate(invalid="ignore", over="ignore"):
            for d in range(width):
                dots += queries[d][..., None] * keys[d][:, None, None, :]
            terms = bf16_round(np.fmax(bf16_round(dots), np.float32(0)) * weights[:, chunk][..., None])
            total = np.zeros(terms.shape[:2] + (records,), dtype=np.float32)
            for head in range(heads):
                total += terms[:, :, head]
        scores[:, chunk] = bf16_round(total)

    map_chunks(score_chunk, query_chunks(sequence, records * batch * heads))
    return masked_scores(geometry, scores, row_limit)
