"""The device's stage-6 payload, observed on the fused attention kernel's score scratch.

Candidate ids are not a kernel output: the attention modules assemble and
score candidates in one launch (stages 6 and 7). A slot is one the kernel
attended to where some head's score is not -inf. Its id is first taken from
the cursors (the dense window the contract prescribes, the selection the
kernel read), then checked against what the kernel actually scored: a valid
slot whose scores (every head, bit for bit) are not the reference's for that
id is identified by its scores instead, as the reference's candidate a few
slots away or as the dense position a few places off, scored on the host
the reference's way. So a window shifted by one shows up at stage 6, not
only as a different Y; a slot whose scores match nothing keeps the
cursors' id and is left to stage 7. Scores that any key of zeros gets (0,
or the bias alone, on every head) name no key by themselves: such a slot
takes a neighbour's id only where the other slots of its row, identified by
scores that do name a key, all moved by that same offset (a shifted window
that reaches a zero row); elsewhere it keeps the cursors' id, so a record
the kernel decoded to zeros is not the neighbouring zero record.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from csa_conform.contract import DENSE_WINDOW, StepGeometry
from csa_conform.numerics.variant import ascending_dot
from csa_conform.oracle.candidate_assembly import candidate_assembly

NEAREST = 4  # slots or positions away an observed id is looked for
SCORED_ON_HOST = 4096  # unmatched dense slots scored on the host when no slot matched a neighbour
ROW_SHIFT_ROWS = 256  # query rows searched for one offset further off than NEAREST


def candidates_read_back(
    g: StepGeometry, scores: np.ndarray, selection_rows: np.ndarray | None, bias: np.ndarray | None,
    reference: Mapping[str, Mapping[str, np.ndarray]] | None = None,
    query: np.ndarray | None = None, current_kv: np.ndarray | None = None,
) -> np.ndarray:
    """Candidate ids i32[B,S,C] from scores f32[B,S,N,C] and the selection the kernel read (ratio 4).

    Where the bias is -inf on every head a slot's validity cannot be observed
    in the scores, so there it is taken from the cursors. With the reference's
    payloads (and the query and current_kv the kernel read) each valid slot's id
    is confirmed or corrected from its scores.
    """
    positions = g.start + np.arange(g.sequence)
    dense_start = np.maximum(g.current_kv_base, np.maximum(positions + 1 - DENSE_WINDOW, 0))
    dense = dense_start[:, None] + np.arange(g.dense_candidates)[None, :]
    if selection_rows is None:
        compressed = np.broadcast_to(np.arange(g.next_records), (g.sequence, g.next_records))
        ids = np.broadcast_to(np.concatenate([dense, compressed], axis=-1), scores.shape[:2] + (scores.shape[3],))
    else:
        ids = np.concatenate([np.broadcast_to(dense, (g.batch,) + dense.shape), selection_rows], axis=-1)
    valid = (scores != -np.inf).any(axis=2)
    if bias is not None:
        structural = candidate_assembly(g, selection_rows)["candidates"] >= 0
        valid |= hidden_by_bias(bias) & structural
    ids = np.where(valid, ids, -1).astype(np.int32)
    if reference is not None:
        ids = _observed(g, ids, valid, scores, reference, bias, query, current_kv)
    return ids


def hidden_by_bias(bias: np.ndarray) -> np.ndarray:
    """bool[B,S,C]: the slots whose bias f32[B,N,S,C] is -inf on every head, where no score shows whether the kernel
    took the slot. Read once along each axis the bias is broadcast on (a [B,N,S,C] mask of a long prefill's
    broadcast bias would be gigabytes)."""
    compact = bias[tuple(slice(0, 1) if stride == 0 else slice(None) for stride in bias.strides)]
    return np.broadcast_to((compact == -np.inf).all(axis=1), bias.shape[:1] + bias.shape[2:])


def _same(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Per slot: every head's score has the same bits."""
    return (left.view(np.uint32) == right.view(np.uint32)).all(axis=2)


def _zero_key(scores: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """f32[B,S,N,C]: what a slot whose key is all zeros scores: 0 (+ its bias)."""
    zero = np.zeros_like(scores)
    return zero if bias is None else zero + bias.transpose(0, 2, 1, 3).astype(np.float32)


def _observed(g, ids, valid, scores, reference, bias, query, current_kv) -> np.ndarray:
    expected_ids = reference.get("candidate_assembly", {}).get("candidates")
    expected_scores = reference.get("sparse_sink_softmax_attention", {}).get("scores")
    if expected_ids is None or expected_scores is None or expected_scores.shape != scores.shape:
        return ids
    unmatched = valid & ~_same(scores, expected_scores)
    if not unmatched.any():  # a conformant launch: nothing to identify (the common case, on every step)
        return ids
    zero = unmatched & _same(scores, _zero_key(scores, bias))  # identified only by its row's shift
    unmatched &= ~zero
    ids = ids.copy()
    shifts = np.zeros(scores.shape[:2] + (2 * NEAREST + 1,), dtype=bool)  # per row: the shifts its slots showed
    for size in range(1, NEAREST + 1):
        for d in (size, -size):
            moved_ids, moved_scores = _moved(expected_ids, expected_scores, d)
            hit = unmatched & (moved_ids >= 0) & _same(scores, moved_scores)
            ids[hit] = moved_ids[hit]
            unmatched &= ~hit
            shifts[..., d + NEAREST] |= hit.any(axis=-1)
    one = shifts.sum(axis=-1) == 1
    for d in range(-NEAREST, NEAREST + 1):
        rows = one & shifts[..., d + NEAREST]
        if d == 0 or not (rows[..., None] & zero).any():
            continue
        moved_ids, moved_scores = _moved(expected_ids, expected_scores, d)
        hit = zero & rows[..., None] & (moved_ids >= 0) & _same(scores, moved_scores)
        ids[hit] = moved_ids[hit]
    dense = unmatched[..., : g.dense_candidates]
    if query is not None and current_kv is not None and dense.any() and (
            shifts.any() or int(dense.sum()) <= SCORED_ON_HOST):
        _dense_by_score(g, ids, unmatched, scores, bias, query, current_kv)
    return ids


def _moved(expected_ids: np.ndarray, expected_scores: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray]:
    """The reference's ids and scores moved d slots up (what a kernel holds whose slots are d places off)."""
    count = expected_scores.shape[-1]
    source = np.arange(count) - d
    inside = (source >= 0) & (source < count)
    moved_scores = np.full_like(expected_scores, -np.inf)
    moved_ids = np.full_like(expected_ids, -1)
    moved_scores[..., inside] = expected_scores[..., source[inside]]
    moved_ids[..., inside] = expected_ids[..., source[inside]]
    return moved_ids, moved_scores


def _dense_by_score(g, ids, unmatched, scores, bias, query, current_kv) -> None:
    """Unmatched dense slots: the position a few places off whose host-computed scores are the device's; then,
    a row at a time, one offset further off for the whole row."""
    b, s, c = np.nonzero(unmatched[..., : g.dense_candidates])
    for size in range(1, NEAREST + 1):
        for d in (-size, size):
            if not b.size:
                return
            position = ids[b, s, c].astype(np.int64) + d
            inside = _in_window(g, s, position)
            if not inside.any():
                continue
            bi, si, ci, pi = b[inside], s[inside], c[inside], position[inside]
            hit = _confirmed(g, scores, bi, si, ci, pi, bias, query, current_kv)
            ids[bi[hit], si[hit], ci[hit]] = pi[hit]
            keep = np.ones(b.size, bool)
            keep[np.flatnonzero(inside)[hit]] = False
            b, s, c = b[keep], s[keep], c[keep]
    if b.size:
        _dense_by_row_shift(g, ids, (b, s, c), scores, bias, query, current_kv)


def _in_window(g, s, position) -> np.ndarray:
    """Whether ``position`` is a key query s may attend: in current_kv and not after the query."""
    return ((position >= g.current_kv_base) & (position - g.current_kv_base < g.current_kv_len)
            & (position <= g.start + s))


def _confirmed(g, scores, b, s, c, position, bias, query, current_kv) -> np.ndarray:
    """[M]: whether the device's scores of slot (b, s, c) are, bit for bit on every head, the reference's scores
    of query (b, s) against the key at ``position`` (with the slot's bias)."""
    host = _scores(query[b, s], current_kv[b, position - g.current_kv_base], g.scale)
    if bias is not None:
        host = host + bias[b, :, s, c]
    return (host.view(np.uint32) == scores[b, s, :, c].view(np.uint32)).all(axis=1)


def _dense_by_row_shift(g, ids, remaining, scores, bias, query, current_kv) -> None:
    """Dense slots still unmatched: a window off by more than NEAREST places (one start for every query of a
    step moves the s-th query's window s places). Per row, the one offset within the step's length at which
    the row's first such slot's host-computed scores are the device's (bit for bit, every head; a row where
    several offsets fit is left alone); each slot of the row takes it only where its own scores confirm it."""
    b, s, c = remaining
    reach = min(g.sequence + NEAREST, DENSE_WINDOW)
    offsets = np.array([d for d in range(-reach, reach + 1) if abs(d) > NEAREST], dtype=np.int64)
    if not offsets.size:
        return
    rows, first, row_of = np.unique(b * g.sequence + s, return_index=True, return_inverse=True)
    first = first[:ROW_SHIFT_ROWS]
    rb, rs, rc = b[first], s[first], c[first]
    position = ids[rb, rs, rc].astype(np.int64)[:, None] + offsets[None, :]
    pair, offset = np.nonzero(_in_window(g, rs[:, None], position))
    fits = np.zeros(position.shape, dtype=bool)
    fits[pair, offset] = _confirmed(g, scores, rb[pair], rs[pair], rc[pair], position[pair, offset], bias, query,
                                    current_kv)
    one = fits.sum(axis=1) == 1
    shift = np.zeros(rows.size, dtype=np.int64)  # 0: no one offset found (or the row not searched)
    shift[: first.size][one] = offsets[np.argmax(fits[one], axis=1)]
    d = shift[row_of.reshape(-1)]
    moved = ids[b, s, c].astype(np.int64) + d
    take = (d != 0) & _in_window(g, s, moved)
    bt, st, ct, pt = b[take], s[take], c[take], moved[take]
    hit = _confirmed(g, scores, bt, st, ct, pt, bias, query, current_kv)
    ids[bt[hit], st[hit], ct[hit]] = pt[hit]


def _scores(q: np.ndarray, values: np.ndarray, scale: float) -> np.ndarray:
    """[M, N] dot(q, v) ascending in d in binary32 (two roundings per step), times scale."""
    return ascending_dot(q, values[:, None, :]) * np.float32(scale)
