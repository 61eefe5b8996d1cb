"""Stage 5, selection (ratio 4): the top Kw causal records by descending score
(`total_cmp` order), padded with -1; any exact tie among a row's scores is the
reference's explicit Unsupported error (its tie order is not frozen)."""

from __future__ import annotations

import numpy as np

from csa_conform.contract import StepGeometry
from csa_conform.errors import ContractError, operator_message
from csa_conform.numerics.rustfmt import rust_display_f32
from csa_conform.oracle.compiled.parallel import map_chunks, query_chunks
from csa_conform.oracle.rows import RowFailure, earliest

STAGE_RANK = 2
# Rows this many times longer than Kw are partitioned rather than argsorted whole.
PARTITION_FACTOR = 8
# Score elements per chunk of query rows: chunks sort on every core (NumPy's sorts release the GIL)
# and keep the sort's int64 order arrays small (an 8K prefill's whole [8192, 2048] order is 128 MiB).
CHUNK_ELEMENTS = 1 << 20


def selection(geometry: StepGeometry, scores: np.ndarray, live: np.ndarray, *prior: RowFailure | None,
              pad: int = -1, over_cache: bool = False, key: str | None = None):
    """Returns {"selected": i32[B,S,Kw], "selected_indices": i32[B,I,S,Kw]} or raises the earliest row failure.

    Equal neighbours among a row's sorted live scores are the ties the
    reference refuses. Once no row ties, live keys are distinct, so any
    sort (stable or not) orders them as a stable sort would, and slots past
    the live ones become -1 (``pad``: a variant's filler) whichever index fills them: a row far longer
    than Kw (a decode at 2^20 tokens) is sorted by value for the tie check
    and partitioned for its top Kw; shorter rows are argsorted once. Rows
    are independent, so they go in chunks of query rows over the cores.
    ``over_cache``: a variant that ranks every record of the cache, so the
    non-causal ones (score -inf, lowest id first) follow a row's causal
    records: slot j past them holds record j (the causal records are 0..n-1).
    ``key``: a variant's sort key on the scores' bits (``SORT_KEYS``), a radix top-k's key conversion done
    another way; None is the reference's total order.
    """
    batch, sequence, records = scores.shape
    width = geometry.topk_width
    selected = np.empty((batch, sequence, width), dtype=np.int32)

    def select_chunk(rows: slice) -> RowFailure | None:
        return _select_rows(scores[:, rows], live[:, rows], width, rows.start, sequence, selected[:, rows], pad,
                            over_cache, key)

    failure = earliest(*prior, *map_chunks(select_chunk, query_chunks(sequence, batch * records, CHUNK_ELEMENTS)))
    if failure is not None:
        raise ContractError(failure.message, failure.kind)
    # Every index head's copy is the same array, so the payload is a read-only view of it (an 8K
    # prefill's [1, 64, 8192, 512] would be 1 GiB of fresh memory); readers that need bytes copy.
    replicated = np.broadcast_to(selected[:, None], (geometry.batch, geometry.index_heads) + selected.shape[1:])
    return {"selected": selected, "selected_indices": replicated}


def _select_rows(scores, live, width: int, first_query: int, sequence: int, selected,
                 pad: int = -1, over_cache: bool = False, key: str | None = None) -> RowFailure | None:
    """Query rows first_query.. of the step: writes their top ``width`` into ``selected``, or returns
    their first tie (the caller raises the step's earliest failure, so a tied chunk's slots are left)."""
    ranked = -scores if key is None else -SORT_KEYS[key](np.ascontiguousarray(scores, np.float32).view(np.uint32))
    keys = np.where(live, ranked, np.inf)
    if 0 < PARTITION_FACTOR * width < keys.shape[-1]:
        failure = _first_tie(scores, live, np.sort(keys, axis=-1), first_query, sequence)
        order = None
    else:
        order = np.argsort(keys, axis=-1)
        failure = _first_tie(scores, live, np.take_along_axis(keys, order, axis=-1), first_query, sequence)
    if failure is not None:
        return failure
    order = _smallest(keys, width) if order is None else order[..., :width]
    filler = pad
    if over_cache:
        slots = np.arange(width)
        filler = np.where(slots < keys.shape[-1], slots, pad)
    selected[...] = np.where(np.take_along_axis(live, order, axis=-1), order, filler)
    return None


# A radix top-k ranks each score's bits as an unsigned key (largest first). The reference's total order flips
# every bit of a negative score and the sign bit of the others; these are that conversion done another way.
SORT_KEYS = {
    "sign-flipped": lambda bits: (bits ^ np.uint32(0x80000000)).astype(np.float64),  # negatives in reverse
    "raw-bits": lambda bits: bits.astype(np.float64),  # negatives above positives, in reverse
}


def _smallest(keys: np.ndarray, width: int) -> np.ndarray:
    """Indices of each row's ``width`` smallest keys, ascending by key (0 < width < row length)."""
    keys_index = np.argpartition(keys, width - 1, axis=-1)[..., :width]
    ranked = np.argsort(np.take_along_axis(keys, keys_index, axis=-1), axis=-1)
    return np.take_along_axis(keys_index, ranked, axis=-1)


def _first_tie(scores, live, ranked, first_query: int, sequence: int) -> RowFailure | None:
    """``ranked``: each row's keys (-score, +inf where not live) in ascending order; the rows are
    queries first_query.. of a step of ``sequence`` queries."""
    within = np.arange(1, ranked.shape[-1]) < live.sum(axis=-1, keepdims=True)
    tied_rows = ((ranked[..., 1:] == ranked[..., :-1]) & within).any(axis=-1)
    if not tied_rows.any():
        return None
    b, chunk_row = np.argwhere(tied_rows)[0]
    row = scores[b, chunk_row][live[b, chunk_row]]
    left, right = _first_equal_pair(row)
    s = first_query + int(chunk_row)
    return RowFailure(
        int(b) * sequence + s,
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
