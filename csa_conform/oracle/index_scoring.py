"""Stage 4, index_scoring (ratio 4).

score(b, s, c) = sum over index heads, ascending, of
relu(dot(q, key_c)) * weight * (1/sqrt(128)/sqrt(I)) for causal records
c < (pos+1)/4; dots ascend in d. -inf marks non-causal records.
"""

from __future__ import annotations

import numpy as np

from csa_conform.contract import StepGeometry
from csa_conform.errors import operator_message
from csa_conform.numerics.records import decode_fp4_record
from csa_conform.numerics.variant import REFERENCE, Numerics
from csa_conform.oracle.compiled.parallel import map_chunks, query_chunks
from csa_conform.oracle.rows import RowFailure

STAGE_RANK = 1
# The per-head intermediates explain probes, per (b, s, record, head): each head's dot, then its ReLU. With the
# per-record score (the head sum) they are 0 at a record the row does not score (neither side computes one).
HEAD_PROBES = ("index_dots", "index_relu")


def causal_records(geometry: StepGeometry, shift: int = 0) -> np.ndarray:
    """Number of records each query of the step may score ((position + 1 + shift) / 4: a variant's count, the
    reference's at shift 0)."""
    positions = geometry.start + np.arange(geometry.sequence)
    return np.minimum((positions + 1 + shift) // 4, geometry.next_records)


def index_scoring(geometry: StepGeometry, transformed, index_keys, index_weight, row_limit: int | None,
                  numerics: Numerics = REFERENCE):
    """Returns ({"scores": f32[B,S,T/4]}, first RowFailure or None) from the packed present keys
    u8[B,T/4,68], decoded as scoring reads them; rows >= row_limit stay -inf."""
    batch, sequence, heads, width = transformed.shape
    logical_keys = decode_fp4_record(index_keys)
    records = logical_keys.shape[1]
    weight_scale = head_weight_scale(width, heads, numerics.scale_folding)
    keys = np.ascontiguousarray(np.moveaxis(logical_keys, -1, 0))
    scores = np.full((batch, sequence, records), -np.inf, dtype=np.float32)
    probes = {name: np.zeros((batch, sequence, records, heads), np.float32) for name in HEAD_PROBES} \
        if numerics.probes is not None else None

    def score_chunk(chunk: slice) -> None:
        queries = np.ascontiguousarray(np.moveaxis(transformed[:, chunk], -1, 0))
        dots = np.zeros(queries.shape[1:] + (records,), dtype=np.float32)
        product = np.empty_like(dots)
        with np.errstate(invalid="ignore", over="ignore"):
            for d in range(width):
                numerics.accumulate(dots, queries[d][..., None], keys[d][:, None, None, :], product)
            relu = np.fmax(dots, np.float32(0))
            weighted = relu * index_weight[:, chunk][..., None]
            total = np.zeros(weighted.shape[:2] + (records,), dtype=np.float32)
            for head in range(heads):
                numerics.accumulate(total, weighted[:, :, head], weight_scale)
        scores[:, chunk] = total
        if probes is not None:
            for name, values in zip(HEAD_PROBES, (dots, relu)):
                probes[name][:, chunk] = np.moveaxis(values, 2, 3)

    map_chunks(score_chunk, query_chunks(sequence, records * batch * heads))
    if probes is not None:
        computed = causal_mask(geometry, records, row_limit, numerics.causal_shift)
        for name, values in probes.items():
            numerics.probe(name, np.where(computed[..., None], values, np.float32(0)))
        numerics.probe("index_score", np.where(computed, scores, np.float32(0)))
    return masked_scores(geometry, scores, row_limit, numerics.causal_shift)


# Other roundings of the head weight scale a port may compute (explain's hypotheses; the reference: none).
SCALE_FOLDINGS = {"product": "1/(sqrt(d)·sqrt(I)): the two square roots multiplied, one division",
                  "folded": "1/sqrt(d·I): one square root of the folded product",
                  "without-heads": "1/sqrt(d): the 1/sqrt(I) head normalization left out",
                  "heads-unrooted": "1/sqrt(d)/I: the head count not square-rooted"}


def head_weight_scale(width: int, heads: int, folding: str | None = None) -> np.float32:
    """1/sqrt(width)/sqrt(heads), each step a binary32 operation (or a SCALE_FOLDINGS variant of it)."""
    one, d, i = np.float32(1), np.float32(width), np.float32(heads)
    if folding == "product":
        return one / (np.sqrt(d) * np.sqrt(i))
    if folding == "folded":
        return one / np.sqrt(d * i)
    if folding == "without-heads":
        return one / np.sqrt(d)
    if folding == "heads-unrooted":
        return one / np.sqrt(d) / i
    return one / np.sqrt(d) / np.sqrt(i)


def masked_scores(geometry: StepGeometry, scores: np.ndarray, row_limit: int | None, causal_shift: int = 0):
    """-inf outside the causal mask and past row_limit, and the first non-finite score's failure."""
    live = causal_mask(geometry, scores.shape[-1], row_limit, causal_shift)
    scores = np.where(live, scores, np.float32(-np.inf))
    return {"scores": scores}, _first_non_finite(scores, live)


def causal_mask(geometry: StepGeometry, records: int, row_limit: int | None, causal_shift: int = 0) -> np.ndarray:
    """[B,S,records] mask of the scores the reference computes (rows before row_limit only)."""
    causal = np.arange(records)[None, None, :] < causal_records(geometry, causal_shift)[None, :, None]
    rows = np.arange(geometry.batch * geometry.sequence).reshape(geometry.batch, geometry.sequence)
    reached = rows < (row_limit if row_limit is not None else rows.size)
    return causal & reached[:, :, None]


def _first_non_finite(scores, causal) -> RowFailure | None:
    bad = causal & ~np.isfinite(scores)
    if not bad.any():
        return None
    sequence = scores.shape[1]
    b, s, record = np.argwhere(bad)[0]
    return RowFailure(
        int(b) * sequence + int(s),
        STAGE_RANK,
        operator_message(f"ratio-4 index score is non-finite at [batch={b}, query={s}, record={record}]"),
    )
