"""Stage 5, selection (ratio 4): the top Kw causal records by descending score
(`total_cmp` order), padded with -1; any exact tie among a row's scores is the
reference's explicit Unsupported error (its tie order is not frozen)."""

from __future__ import annotations

import numpy as np

from csa_conform.contract import StepGeometry
from csa_conform.errors import ContractError, operator_message
from csa_conform.numerics.rustfmt import rust_display_f32
from csa_conform.oracle.rows import RowFailure, earliest

STAGE_RANK = 2
# Rows this many times longer than Kw are partitioned rather than argsorted whole.
PARTITION_FACTOR = 8


def selection(geometry: StepGeometry, scores: np.ndarray, live: np.ndarray, *prior: RowFailure | None):
    """Returns {"selected": i32[B,S,Kw], "selected_indices": i32[B,I,S,Kw]} or raises the earliest row failure.

    Equal neighbours among a row's sorted live scores are the ties the
    reference refuses. Once no row ties, live keys are distinct, so any
    sort (stable or not) orders them as a stable sort would, and slots past
    the live ones become -1 whichever index fills them: a row far longer
    than Kw (a decode at 2^20 tokens) is sorted by value for the tie check
    and partitioned for its top Kw; shorter rows are argsorted once.
    """
    keys = np.where(live, -scores, np.inf)
    width = geometry.topk_width
    if 0 < PARTITION_FACTOR * width < keys.shape[-1]:
        failure = earliest(*prior, _first_tie(scores, live, np.sort(keys, axis=-1)))
        order = None
    else:
        order = np.argsort(keys, axis=-1)
        failure = earliest(*prior, _first_tie(scores, live, np.take_along_axis(keys, order, axis=-1)))
    if failure is not None:
        raise ContractError(failure.message, failure.kind)
    order = _smallest(keys, width) if order is None else order[..., :width]
    chosen = np.take_along_axis(live, order, axis=-1)
    selected = np.where(chosen, order, -1).astype(np.int32)
    replicated = np.broadcast_to(selected[:, None], (geometry.batch, geometry.index_heads) + selected.shape[1:])
    return {"selected": selected, "selected_indices": np.ascontiguousarray(replicated)}


def _smallest(keys: np.ndarray, width: int) -> np.ndarray:
    """Indices of each row's ``width`` smallest keys, ascending by key (0 < width < row length)."""
    keys_index = np.argpartition(keys, width - 1, axis=-1)[..., :width]
    ranked = np.argsort(np.take_along_axis(keys, keys_index, axis=-1), axis=-1)
    return np.take_along_axis(keys_index, ranked, axis=-1)


def _first_tie(scores, live, ranked) -> RowFailure | None:
    """``ranked``: each row's keys (-score, +inf where not live) in ascending order."""
    within = np.arange(1, ranked.shape[-1]) < live.sum(axis=-1, keepdims=True)
    tied_rows = ((ranked[..., 1:] == ranked[..., :-1]) & within).any(axis=-1)
    if not tied_rows.any():
        return None
    b, s = np.argwhere(tied_rows)[0]
    row = scores[b, s][live[b, s]]
    left, right = _first_equal_pair(row)
    return RowFailure(
        int(b) * scores.shape[1] + int(s),
        STAGE_RANK,
        operator_message(f"portable top-k tie ordering is unfrozen: "
                         f"equal score {rust_display_f32(row[left])} at [batch={b}, query={s}] "
                         f"for compressed records {left} and {right}", "unsupported"),
        "unsupported",
    )


def _first_equal_pair(row: np.ndarray) -> tuple[int, int]:
    """The reference scans left ascending, then right ascending; that is the pair it names."""
    for left in range(row.size):
        equal = np.flatnonzero(row[left + 1 :] == row[left])
        if equal.size:
            return left, left + 1 + int(equal[0])
    raise AssertionError("tie detected by sorting but not by pairwise scan")
