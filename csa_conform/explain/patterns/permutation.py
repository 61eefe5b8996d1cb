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
"""

from __future__ import annotations

import numpy as np

from csa_conform.explain.patterns.findings import (
    MIN_SUPPORT,
    PERMUTATION,
    Context,
    Finding,
    beats_chance,
    chance,
    coordinates,
)
from csa_conform.explain.patterns.shift import meaningful
from csa_conform.numerics.bits import equal_bits


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
        return None
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
    if same_values.all() and beats_chance(considered, coincidences, considered):
        count = int(rows.sum())
        headline = (f"{tensor} holds the reference's values in another order: each of the {count:,} differing rows "
                    "is a reordering of the reference row")
        return Finding(PERMUTATION, stage, tensor, headline, differing, differing,
                       {"pattern": "reordered", "rows": count, "support": considered})
    return None
