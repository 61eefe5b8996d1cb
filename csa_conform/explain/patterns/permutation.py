"""Permutations: the device row is the reference row with its parts reordered.

Pack-order and layout bugs move values without changing them: the nibbles of
an FP4 byte swapped, the two bytes of a bf16 swapped, the two halves of a
RoPE pair exchanged (interleaved vs split halves), a row written back to
front, or any reordering of a row's values.

A pattern is claimed only on positive evidence: at least MIN_SUPPORT
identifying differing elements fit it, and in the rows that differ the
device holds the pattern's value in most places where the pattern moves a
value (PREDICTED), not only where the device happened to change: a reversed
row that fits one changed slot but none of the 127 others it would move is
a coincidence. And it must beat chance (findings.beats_chance): fit twice
the coincidences expected of the values alone (for each differing element,
the share of its reference row holding the device's value: FP4 bytes and
small ids repeat often), and more than they make with probability 10^-3.

Rows of ids (a selection, candidate ids) are padded with -1 and ordered only
in part: there the canonical orders (ORDERS) move only the valid entries,
from the first column where a row differs: rotated (the row's last entries
moved ahead of the others), written back to front, sorted by record id either
way, or ascending by the reference's own score. One is claimed only when it
makes the whole tensor the device's bit for bit (every differing row, and the
matching rows left as they are) on at least MIN_SUPPORT identifying elements
beyond chance; any other that does too is named as its equal, except a sort
where a rotation fits: a row made of two sorted runs (a dense window, then
the records) comes out sorted when a kernel only writes its runs the other
way round, so there the sort is no evidence of sorting. Below that, a tensor
whose every differing row holds the reference row's values bit for bit, each
as often, is an observation: the
reference's values in another order, which order unsaid; so is one row
alone (or rows that hold the same values) that no canonical order fits: tied
values make a reordering of one row a coincidence too often to call it the
kernel's.
"""

from __future__ import annotations

import numpy as np

from csa_conform.explain.claims import OBSERVATION
from csa_conform.explain.patterns.findings import (
    MIN_SUPPORT,
    PERMUTATION,
    ROW_ALIASING,
    Context,
    Finding,
    beats_chance,
    chance,
    coordinates,
    spans,
)
from csa_conform.explain.patterns.shift import meaningful
from csa_conform.numerics.bits import equal_bits, unsigned


PREDICTED = 0.75  # share of the elements a pattern moves (in the differing rows) the device must hold


def _rows(array: np.ndarray) -> np.ndarray:
    return array.reshape(-1, array.shape[-1]) if array.ndim else array.reshape(1, 1)


def _pair_swapped(array: np.ndarray) -> np.ndarray | None:
    if array.shape[-1] % 2:
        return None
    pairs = array.reshape(array.shape[:-1] + (array.shape[-1] // 2, 2))
    return pairs[..., ::-1].reshape(array.shape)


def _halves_swapped(array: np.ndarray) -> np.ndarray | None:
    if array.shape[-1] % 2:
        return None
    half = array.shape[-1] // 2
    return np.concatenate([array[..., half:], array[..., :half]], axis=-1)


def _candidates(expected: np.ndarray):
    """(pattern, what the reference becomes under it), cheapest and most specific first."""
    if expected.dtype == np.uint8:
        yield "nibbles swapped", "each byte's two 4-bit codes exchanged (pack order: high nibble first)", \
            ((expected >> 4) | (expected << 4)).astype(np.uint8)
    yield "row reversed", "each row written back to front", expected[..., ::-1]
    swapped = _pair_swapped(expected)
    if swapped is not None:
        what = ("adjacent bytes exchanged (byte order of 16-bit values)" if expected.dtype == np.uint8
                else "the two elements of each (2i, 2i+1) pair exchanged (pair layout)")
        yield "pairs swapped", what, swapped
    halves = _halves_swapped(expected)
    if halves is not None:
        yield "halves swapped", "the two halves of each row exchanged", halves


def permuted(stage: str, tensor: str, expected, actual, differ, axes, context: Context) -> Finding | None:
    if expected.ndim == 0:
        return None
    differing = int(np.count_nonzero(differ))
    rows = _rows(differ).any(axis=1)
    identifying = differ & meaningful(actual)
    considered = int(np.count_nonzero(identifying))
    if considered < MIN_SUPPORT:
        return _reordered(stage, tensor, expected, actual, differ, axes, rows)
    # a reordering of the row fits about this many identifying elements by coincidence of their values alone
    coincidences = chance(expected, actual, identifying)
    for pattern, what, moved in _candidates(expected):
        fits = equal_bits(moved, actual) & differ
        covered = int(np.count_nonzero(fits))
        # fillers (0, -1, -inf) moving onto fillers prove nothing: most identifying elements must fit too
        identified = int(np.count_nonzero(fits & identifying))
        in_rows = np.broadcast_to(rows.reshape(differ.shape[:-1] + (1,)) if differ.ndim else rows, differ.shape)
        moves = ~equal_bits(moved, expected) & in_rows
        predicted = int(np.count_nonzero(equal_bits(moved, actual) & moves))
        if (covered >= 0.9 * differing and identified >= max(MIN_SUPPORT, considered // 2)
                and predicted >= PREDICTED * int(np.count_nonzero(moves)) and beats_chance(identified, coincidences, considered)):
            fitting_rows = int(np.count_nonzero(_rows(fits).any(axis=1)))
            first = int(np.flatnonzero(fits)[0])
            headline = (f"{tensor} is the reference's with {what}: {covered:,} of {differing:,} differing elements "
                        f"match, in {fitting_rows:,} rows; first at {coordinates(first, actual.shape, axes)}")
            return Finding(PERMUTATION, stage, tensor, headline, covered, differing,
                           {"pattern": pattern, "rows": fitting_rows, "first": coordinates(first, actual.shape, axes),
                            "support": identified, "predicted": predicted, "moved": int(np.count_nonzero(moves)),
                            "chance": round(coincidences, 2)})
    if expected.ndim == 0 or expected.shape[-1] < 2:
        return None
    expected_rows, actual_rows = _rows(expected)[rows], _rows(actual)[rows]
    if not expected_rows.size:
        return None
    same_values = (np.sort(expected_rows, axis=1) == np.sort(actual_rows, axis=1)).all(axis=1)
    if expected.dtype.kind == "f":
        same_values &= np.isfinite(expected_rows).all(axis=1)
    same_values &= meaningful(actual_rows).any(axis=1)
    if not same_values.all():
        return _reordered(stage, tensor, expected, actual, differ, axes, rows)
    if expected.dtype.kind == "i":  # ids (bytes of packed records are no ids)
        ordered = _ordered_ids(stage, tensor, expected, actual, differ, axes, rows, context, considered,
                               coincidences)
        if ordered is not None:
            return ordered
    elsewhere = _held_elsewhere(stage, tensor, expected, actual, differ, axes, rows)
    if elsewhere is not None:
        return elsewhere
    distinct = np.unique(unsigned(expected_rows), axis=0).shape[0]  # tied batch rows are one row said twice
    if distinct >= 2 and beats_chance(considered, coincidences, considered):
        count = int(rows.sum())
        headline = (f"{tensor} holds the reference's values in another order: each of the {count:,} differing rows "
                    "is a reordering of the reference row")
        return Finding(PERMUTATION, stage, tensor, headline, differing, differing,
                       {"pattern": "reordered", "rows": count, "support": considered})
    return _reordered(stage, tensor, expected, actual, differ, axes, rows)


# The canonical orders of a row of ids: (pattern, what the device's rows are) for the valid entries (not -1)
# from the first column where a row differs; the score order needs the reference's scores of the row's ids.
ORDERS = (("valid entries rotated", "rotated"),
          ("valid entries reversed", "written back to front"),
          ("sorted by id", "sorted by record id, ascending"),
          ("sorted by id, descending", "sorted by record id, descending"),
          ("ascending by score", "sorted by the reference's own score ascending (lowest first, ties by id)"))
SORTS = frozenset({"sorted by id", "sorted by id, descending", "ascending by score"})
SCORED = {"selection": ("index_scoring", "scores")}  # where a stage's ids index the reference's score rows


def _ordered_ids(stage, tensor, expected, actual, differ, axes, rows, context: Context, considered: int,
                 coincidences: float) -> Finding | None:
    """The canonical order of the valid entries that makes the whole tensor the device's bit for bit, on at
    least MIN_SUPPORT identifying elements that beat chance (any other that does too named as equal); None when
    none does."""
    if not beats_chance(considered, coincidences, considered):
        return None
    reference, device = _rows(expected), _rows(actual)
    start = int(np.flatnonzero(_rows(differ).any(axis=0))[0])
    valid = (reference != -1) & (np.arange(reference.shape[1]) >= start)
    scores = _scores(stage, context, reference)
    keys = {"valid entries reversed": (-np.arange(reference.shape[1]) * np.ones_like(reference),),
            "sorted by id": (reference,), "sorted by id, descending": (-reference.astype(np.int64),),
            "ascending by score": None if scores is None else (reference, scores)}
    # a rotation may start before the first differing column: the runs' first entries can coincide
    turns = None
    for origin in sorted({0, start}):
        turns = _rotations(reference, device, (reference != -1) & (np.arange(reference.shape[1]) >= origin),
                           _rows(differ).any(axis=1))
        if turns is not None:
            break
    fitting = [(pattern, what) for pattern, what in ORDERS
               if (turns is not None if pattern == "valid entries rotated" else
                   keys[pattern] is not None and np.array_equal(_placed(reference, valid, keys[pattern]), device))]
    if turns is not None:
        fitting = [(pattern, what) for pattern, what in fitting if pattern not in SORTS]
        fitting[0] = (fitting[0][0], f"rotated, its last {spans(set(turns))} put ahead of the others")
        start = origin
    if not fitting:
        return None
    (pattern, what), others = fitting[0], fitting[1:]
    count, differing = int(rows.sum()), int(np.count_nonzero(differ))
    where = f" from {axes[-1]} = {start}" if start else ""
    equally = f" (equally: {'; '.join(other for _, other in others)})" if others else ""
    headline = (f"{tensor} is the reference's with each row's valid entries (not -1){where} {what}{equally}: all "
                f"{count:,} differing rows ({differing:,} elements) are that order bit for bit, and the matching rows "
                "keep it")
    return Finding(PERMUTATION, stage, tensor, headline, differing, differing,
                   {"pattern": pattern, "equally": [other for other, _ in others], "rows": count,
                    "support": considered, "from": start, "chance": round(coincidences, 2)})


def _rotations(reference: np.ndarray, device: np.ndarray, valid: np.ndarray,
               differing: np.ndarray) -> list[int] | None:
    """For every differing row, by how many places its valid entries are rotated (the last that many put ahead
    of the others) to give the device's row, the other entries left as they are; None when a row fits none."""
    turns = []
    for row in np.flatnonzero(differing):
        places = np.flatnonzero(valid[row])
        ids, held = reference[row, places], device[row, places]
        kept = np.ones(reference.shape[1], dtype=bool)
        kept[places] = False
        if ids.size < 2 or not np.array_equal(reference[row, kept], device[row, kept]):
            return None
        # the device's first valid entry is the reference's entry at ids.size - turn
        turn = next((int(ids.size - j) for j in np.flatnonzero(ids == held[0])
                     if j and np.array_equal(np.roll(ids, ids.size - j), held)), None)
        if turn is None:
            return None
        turns.append(turn)
    return turns


def _scores(stage: str, context: Context, reference: np.ndarray) -> np.ndarray | None:
    """Each id's score in the reference's score row of its own row (where the stage's ids index one), else None."""
    source = SCORED.get(stage)
    held = context.expected.get(source[0], {}).get(source[1]) if source else None
    if held is None:
        return None
    held = np.asarray(held)
    table = held.reshape(-1, held.shape[-1])
    if table.shape[0] != reference.shape[0] or reference.max(initial=-1) >= table.shape[1]:
        return None
    return np.take_along_axis(table, np.maximum(reference, 0).astype(np.int64), axis=1)


def _placed(ids: np.ndarray, valid: np.ndarray, keys: tuple[np.ndarray, ...]) -> np.ndarray:
    """Each row with its valid entries put in the order ``keys`` sort them in (the last key primary), in the
    valid entries' own places; the other entries stay."""
    order = np.lexsort(keys + (~valid,), axis=-1)
    places = np.argsort(~valid, axis=-1, kind="stable")
    kept = np.arange(ids.shape[1]) < valid.sum(axis=1)[:, None]
    placed = ids.copy()
    row = np.broadcast_to(np.arange(ids.shape[0])[:, None], ids.shape)
    placed[row[kept], places[kept]] = np.take_along_axis(ids, order, axis=1)[kept]
    return placed


def _reordered(stage: str, tensor: str, expected, actual, differ, axes, rows) -> Finding | None:
    """An observation: every differing row holds the reference row's values bit for bit, each as often, in
    another order (no order claimed: too few elements to tell one from a coincidence, or none fits). It ends
    nothing: the re-runs still run (a row read at another row's offset also holds a reordering of it, and a
    re-run that reproduces the bytes names why) and the numeric search runs on floats (scores whose slots
    moved)."""
    if expected.dtype.kind not in "iuf" or expected.ndim < 2 or not rows.any():
        return None
    reference, device = _rows(unsigned(expected))[rows], _rows(unsigned(actual))[rows]
    if not (np.sort(reference, axis=1) == np.sort(device, axis=1)).all():
        return None
    if not (meaningful(_rows(actual)[rows]) & _rows(differ)[rows]).any():
        return None
    elsewhere = _held_elsewhere(stage, tensor, expected, actual, differ, axes, rows)
    if elsewhere is not None:
        return elsewhere
    count, differing = int(rows.sum()), int(np.count_nonzero(differ))
    columns = spans(np.flatnonzero(_rows(differ).any(axis=0)))
    headline = (f"each differing row of {tensor} holds the reference row's values in another order ({count:,} of "
                f"{count:,} rows; the {differing:,} differing elements at {axes[-1]} = {columns})")
    return Finding(PERMUTATION, stage, tensor, headline, differing, differing,
                   {"pattern": "reordered", "rows": count, "support": differing, "structural": False},
                   source=OBSERVATION)


def _held_elsewhere(stage: str, tensor: str, expected, actual, differ, axes, rows) -> Finding | None:
    """An observation: every differing row is, bit for bit, another of the reference's rows, and (as the callers
    checked) its own row's values in another order too: a batch row given batch 0's selection, or its own
    selection in another order, when both rows select every record. Both facts are said; which one the kernel
    did, only a re-run says."""
    reference, device = _rows(unsigned(expected)), _rows(unsigned(actual))
    places: dict[bytes, int] = {}
    for index in range(reference.shape[0] - 1, -1, -1):  # the first row holding them wins
        places[reference[index].tobytes()] = index
    held = {}
    for index in np.flatnonzero(rows):
        source = places.get(device[index].tobytes())
        if source is None or source == index:
            return None
        held[int(index)] = source
    shape, names = expected.shape[:-1], axes[:-1]

    def at(row: int) -> str:
        return ", ".join(f"{name}={int(i)}" for name, i in zip(names, np.unravel_index(row, shape)))

    count, differing = len(held), int(np.count_nonzero(differ))
    pairs = "; ".join(f"{at(k)} holds {at(j)}'s" for k, j in list(held.items())[:4])
    more = f"; and {count - 4} more" if count > 4 else ""
    columns = spans(np.flatnonzero(_rows(differ).any(axis=0)))
    headline = (f"each differing row of {tensor} is, bit for bit, another of the reference's rows ({pairs}{more}; "
                f"{count:,} of {count:,} rows, the {differing:,} differing elements at {axes[-1]} = {columns}), "
                "and its own row's values in another order: the bytes do not tell a row read at another place from "
                "a reordering")
    return Finding(ROW_ALIASING, stage, tensor, headline, differing, differing,
                   {"rows": held, "support": differing, "structural": False}, source=OBSERVATION)
