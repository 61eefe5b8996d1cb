"""Stage 7, sparse_sink_softmax_attention.

Per (b, s, h): score_c = dot(q, kv_c) * scale (+ bias), dots ascending in d;
m = max over valid scores; Z = ascending sum of expf(score_c - m), then
+ expf(sink[h] - m) — the sink is logit-only mass, never in the max and
without a value; Y = ascending sum over c of (expf(score_c - m) / Z) * kv_c.
A row with no valid candidate is zeros. The loops run over d and c only,
every (b, s, h, c) element in parallel, so each element keeps the
reference's order. Candidate columns invalid for a whole query chunk are
skipped: they would add exactly +0 to Z and to Y.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from csa_conform.contract import StepGeometry
from csa_conform.errors import invalid
from csa_conform.numerics.records import decode_fp8_record
from csa_conform.numerics.variant import LOGIT_SUM, REFERENCE, VALUE_SUM, Numerics
from csa_conform.oracle.compiled.parallel import map_chunks, query_chunks
from csa_conform.oracle.payloads import StagePayload

# Attention's scores are held in the payload up to this size. Beyond it (a long prefill: 1.25 GiB at
# S = 8192, N = 64, more than Y's 1 GiB) each query chunk's scores are used and dropped, and the
# payload recomputes them all, bit for bit, only when something reads them (StagePayload). Held
# scores cost a step that reads them nothing more: generate and verify of the prod suite (160 MiB
# at S = 1024) store and compare every one.
HELD_SCORES_BYTES = 256 << 20


# The softmax intermediates explain probes, per (b, s, h) row, then per (b, s, h, c) slot: the probabilities,
# 0 at a slot without a valid candidate and in a row without any (neither side computes one there).
SOFTMAX_PROBES = ("softmax_max", "softmax_denominator")
SLOT_PROBE = "softmax_probabilities"


def held_scores(shape: tuple[int, ...]) -> bool:
    """Whether scores of ``shape`` [B, S, N, C] are held, not recomputed on first read."""
    return int(np.prod(shape)) * np.dtype(np.float32).itemsize <= HELD_SCORES_BYTES


def sparse_sink_softmax_attention(
    geometry: StepGeometry,
    query: np.ndarray,
    current_kv: np.ndarray,
    present_compressed_kv: np.ndarray,
    candidates: np.ndarray,
    head_sink: np.ndarray,
    bias: np.ndarray | None,
    numerics: Numerics = REFERENCE,
) -> Mapping[str, np.ndarray]:
    batch, sequence, heads, dim = query.shape
    source, rows = candidate_rows(geometry, current_kv, present_compressed_kv, candidates)
    source_by_dim = np.ascontiguousarray(np.moveaxis(source, -1, 0)).reshape(dim, -1)
    flat_rows = rows + (np.arange(batch) * source.shape[1])[:, None, None]
    empty_row = source.shape[1] - 1
    count = candidates.shape[-1]
    shape = (batch, sequence, heads, count)
    scores = np.empty(shape, dtype=np.float32) if held_scores(shape) else None
    output = np.empty(query.shape, dtype=np.float32)
    batch_index = np.arange(batch)[:, None, None]
    chunks = query_chunks(sequence, _per_query(count, batch, heads, dim))

    def chunk_scores(chunk: slice):
        """(candidate columns live in the chunk, their rows, their scores)."""
        live = np.flatnonzero((rows[:, chunk] != empty_row).any(axis=(0, 1)))
        row_ids = rows[:, chunk][:, :, live]
        keys = np.take(source_by_dim, flat_rows[:, chunk][:, :, live], axis=1)
        queries = np.ascontiguousarray(np.moveaxis(query[:, chunk], -1, 0))
        live_scores = _scaled_scores(keys, queries, geometry.scale, numerics)
        if bias is not None:
            live_scores += bias[:, :, chunk][..., live].transpose(0, 2, 1, 3)
        live_scores[np.broadcast_to((row_ids == empty_row)[:, :, None, :], live_scores.shape)] = -np.inf
        return live, row_ids, live_scores

    def keep(target: np.ndarray, chunk: slice, live: np.ndarray, live_scores: np.ndarray) -> None:
        target[:, chunk] = -np.inf
        target[:, chunk, :, live] = live_scores

    probes = {name: np.zeros(shape[:3], np.float32) for name in SOFTMAX_PROBES} if numerics.probes is not None \
        else None
    if probes is not None:
        probes[SLOT_PROBE] = np.zeros(shape, np.float32)

    def attend(chunk: slice):
        live, row_ids, live_scores = chunk_scores(chunk)
        deferred = numerics.deferred_normalization
        probed = {} if probes is not None or deferred else None
        probabilities, failure = softmax_with_sink(live_scores, head_sink, chunk.start, numerics.expf,
                                                   _unnormalized if deferred else numerics.normalized,
                                                   None if numerics.weights_expf is None else numerics.weight_exp,
                                                   numerics.sink_in_max, probed)
        if probes is not None:
            for name in SOFTMAX_PROBES:
                probes[name][:, chunk] = probed[name]
            probes[SLOT_PROBE][:, chunk, :, live] = np.moveaxis(probabilities, 0, -1)
        values = source[batch_index.transpose(1, 0, 2), row_ids.transpose(2, 0, 1)]
        output[:, chunk] = _value_sum(probabilities, values, live, probed, numerics)
        if scores is not None:
            keep(scores, chunk, live, live_scores)
        return failure

    raise_first_invalid(geometry, map_chunks(attend, chunks))
    for name, values in (probes or {}).items():
        numerics.probe(name, values)
    if scores is not None:
        return {"scores": scores, "Y": output}

    def every_score() -> np.ndarray:
        recomputed = np.empty(shape, dtype=np.float32)

        def score(chunk: slice) -> None:
            live, _, live_scores = chunk_scores(chunk)
            keep(recomputed, chunk, live, live_scores)

        map_chunks(score, chunks)
        return recomputed

    return StagePayload({"Y": output}, {"scores": every_score}, order=("scores", "Y"))


def raise_first_invalid(geometry: StepGeometry, chunk_failures) -> None:
    """The reference's error for the first (b, s, h) whose softmax denominator is invalid, if any."""
    failures = [failure for failure in chunk_failures if failure]
    if failures:
        b, s, h = min(failures)
        prefix = "ratio-4 " if geometry.ratio == 4 else ""
        raise invalid(f"{prefix}softmax denominator is invalid at [batch={b}, head={h}, query={s}]")


def _per_query(count: int, batch: int, heads: int, dim: int) -> int:
    """Working-set elements one query adds to a chunk (scores and gathered rows)."""
    return max(count * batch * heads, count * batch * dim // 16)


def candidate_rows(geometry, current_kv, present_compressed_kv, candidates, decode=decode_fp8_record):
    """Rows of [current_kv | the records candidates name | zeros] per batch, and each candidate's row in it.

    Only the records some candidate names are read from the present cache
    (decoded when it is FP8): a ratio-4 decode at 2^20 tokens reads 512 of
    262,144, and the gather never copies the cache. ``decode`` is the FP8
    record decoder (the numba engine passes its compiled twin).
    """
    batch, dim = current_kv.shape[0], current_kv.shape[-1]
    records, rows = candidate_records(geometry, present_compressed_kv, candidates, decode, in_place=False)
    source = np.concatenate([current_kv, records, np.zeros((batch, 1, dim), dtype=np.float32)], axis=1)
    return source, np.where(rows < 0, source.shape[1] - 1, rows)


def candidate_records(geometry, present_compressed_kv, candidates, decode, in_place: bool):
    """(records, rows): f32 (or packed FP8, below) records holding every record some candidate names,
    and each candidate's row: r < current_kv_len is current_kv's row r, r >= current_kv_len is records' row
    r - current_kv_len, -1 is an empty slot.

    An FP8 cache decodes only the named records. Read ``in_place`` (by
    kernels that index the records and decode FP8 ones as they read them),
    an f32 cache is the cache itself, and FP8 records that no more slots
    name than there are records stay packed: a ratio-128 decode names each
    of its 8,192 records once, and decoding them first would fill 16 MiB of
    fresh memory. Otherwise only the named records are copied out. Records
    are named through a mask over the cache, not a sort: an 8K prefill
    names 4 M slots.
    """
    dense = candidates[..., : geometry.dense_candidates]
    compressed = candidates[..., geometry.dense_candidates :]
    if in_place and present_compressed_kv.dtype == np.float32:
        records, record_rows = present_compressed_kv, compressed
    else:
        named = np.zeros(present_compressed_kv.shape[1], dtype=bool)
        named[compressed[compressed >= 0]] = True
        if named.all():  # every record (a ratio-128 step): nothing to gather
            records, record_rows = present_compressed_kv, compressed
        else:
            records = np.take(present_compressed_kv, np.flatnonzero(named), axis=1)
            named_before = np.zeros(named.size + 1, dtype=np.int64)
            np.cumsum(named, out=named_before[1:])
            record_rows = named_before[np.maximum(compressed, 0)]
        named_once = np.count_nonzero(compressed >= 0) <= records.shape[0] * records.shape[1]
        if records.dtype == np.uint8 and not (in_place and named_once):
            records = decode(records)
        elif records.dtype != np.uint8:
            records = records.astype(np.float32, copy=False)
    rows = np.concatenate(
        [
            np.where(dense >= 0, dense - geometry.current_kv_base, -1),
            np.where(compressed >= 0, geometry.current_kv_len + record_rows, -1),
        ],
        axis=-1,
    )
    return records, rows


def _scaled_scores(keys, queries, scale, numerics: Numerics) -> np.ndarray:
    """[B,s,N,C] dots ascending in d, times scale; C innermost keeps NumPy's inner loop long. Explain's
    variant carries each dot in binary64 and rounds it to binary32 once, before the scale."""
    if numerics.binary64_logits:
        dots = _binary64_sum(queries, keys, np.zeros(len(queries), dtype=np.int64), numerics)
        if numerics.counting:
            numerics.count(LOGIT_SUM, numerics.outer_sum(queries, keys, logit_dot=True), dots)
    else:
        dots = numerics.outer_sum(queries, keys, logit_dot=True)
    with np.errstate(over="ignore", invalid="ignore"):
        dots *= scale
    return dots


def softmax_with_sink(scores, head_sink, first_query, exp, normalized=np.divide, weight_exp=None,
                      sink_in_max: bool = False, probed: dict | None = None):
    """Probabilities [C,B,s,N] of scores [B,s,N,C], and the first (b, s, h) whose denominator is invalid.

    `exp` is the numerics' expf (glibc's, as the NumPy port, unless explain swapped it), `normalized` how the
    weights are put over their denominator (divided, unless explain swapped it); `weight_exp`, when given,
    recomputes the weights over the denominator with another exp (a kernel's second pass); ``sink_in_max``
    takes the sink logit into the running max of rows with a candidate (a port's variant). ``probed``, when
    given, receives each row's maximum and denominator (0 for a row without a candidate, which none reads) as
    explain's probes compare them (specs/kernel-abi.md, "Probes").
    """
    with np.errstate(over="ignore", invalid="ignore"):
        maximum = np.fmax.reduce(scores, axis=-1, initial=-np.inf)
        active = maximum != -np.inf
        if sink_in_max:
            maximum = np.where(active, np.fmax(maximum, np.asarray(head_sink, np.float32)), maximum)
        exponent = np.ascontiguousarray(np.moveaxis(scores - maximum[..., None], -1, 0))
        valid = np.moveaxis(scores, -1, 0) != -np.inf
        weights = np.where(valid, exp(exponent), np.float32(0))
        denominator = np.zeros(maximum.shape, dtype=np.float32)
        for candidate in weights:
            denominator += candidate
        denominator += exp(head_sink - maximum)
        invalid = active & ((denominator == 0) | ~np.isfinite(denominator))
        if probed is not None:
            probed["softmax_max"] = maximum
            probed["softmax_denominator"] = np.where(active, denominator, np.float32(0))
        if weight_exp is not None:
            weights = np.where(valid, weight_exp(exponent), np.float32(0))
        probabilities = np.where(active, normalized(weights, denominator), np.float32(0))
    if invalid.any():
        b, s, h = np.argwhere(invalid)[0]
        return probabilities, (int(b), first_query + int(s), int(h))
    return probabilities, None


def _unnormalized(weights: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """The weights exp(s - m) as they are: a deferred normalization divides the finished value sum by Z."""
    return weights


def _value_sum(weights, values, slots, probed, numerics: Numerics) -> np.ndarray:
    """[B,s,N,D] = the value sum over candidates: the reference's ascending binary32 sum of p_c * value_c, or
    (explain's variants) carried in binary64 and rounded once per tile of candidate slots, and/or over the
    weights exp(s_c - m), divided by the row's denominator once per output element (deferred normalization).
    ``weights`` are then the unnormalized ones and ``probed`` holds the row's maximum and denominator."""
    if numerics.binary64_values is None:
        summed = _weighted_values(weights, values, numerics)
    else:
        summed = _binary64_values(weights, values, slots, numerics)
    if numerics.deferred_normalization:
        active = probed["softmax_max"] != -np.inf
        denominator = np.where(active, probed["softmax_denominator"], np.float32(1))
        summed = np.where(active[..., None], summed / denominator[..., None], np.float32(0))
        weights = np.where(active, weights / denominator, np.float32(0))  # the reference's probabilities
    if numerics.counting and (numerics.deferred_normalization or numerics.binary64_values is not None):
        numerics.count(VALUE_SUM, _weighted_values(weights, values, numerics), summed)
    return summed.astype(np.float32, copy=False)


def _binary64_values(weights, values, slots, numerics: Numerics) -> np.ndarray:
    """The ascending sum of p_c * value_c in binary64, rounded to binary32 at the end of each tile of
    ``numerics.binary64_values`` candidate slots (0: once), as a kernel keeping a wide accumulator per tile
    does."""
    tile = numerics.binary64_values
    tiles = np.asarray(slots, dtype=np.int64) // tile if tile else np.zeros(len(slots), dtype=np.int64)
    return _binary64_sum(weights, values, tiles, numerics)


def _binary64_sum(a, b, tiles, numerics: Numerics) -> np.ndarray:
    """[B,s,X,Y] = Σ_k a[k,B,s,X] * b[k,B,s,Y] ascending in k from +0 in binary64 (each product exact),
    rounded to binary32 where ``tiles[k]`` changes and at the end; in one pass where
    ``numerics.wide_accumulation`` is given."""
    if numerics.wide_accumulation is not None:
        return numerics.wide_accumulation(a, b, tiles)
    output = np.zeros(b.shape[1:3] + a.shape[-1:] + b.shape[-1:], dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        for index, (left, right) in enumerate(zip(a, b)):
            if index and tiles[index] != tiles[index - 1]:
                output = output.astype(np.float32).astype(np.float64)
            output += left[..., None].astype(np.float64) * right[:, :, None, :].astype(np.float64)
        return output.astype(np.float32)


def _weighted_values(probabilities, values, numerics: Numerics) -> np.ndarray:
    """[B,s,N,D] = ascending sum over candidates of p_c * value_c."""
    return numerics.outer_sum(probabilities, values, value_sum=True)
