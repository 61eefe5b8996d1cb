"""Layouts and aliasing: the device's tensor is the reference's with its axes written in another order, or
one row holds another row's data.

A kernel that writes [B,H,S,D] where the contract lays out [B,S,H,D] leaves
the reference's values in the device's bytes, each at the offset the other
order gives it; a batch or head offset left out (or taken from the wrong
index) makes row b hold row b′'s values whole, but so does a kernel whose rows
all compute the same thing: an alias is stated as the fact it is, and which
offset a kernel leaves out is only the reading re-runs' to say. Both are
claimed only on at least MIN_SUPPORT identifying differing elements (not
fillers) that fit.
"""

from __future__ import annotations

import itertools

import numpy as np

from csa_conform.explain.patterns.findings import LAYOUT, MIN_SUPPORT, ROW_ALIASING, Context, Finding, spans
from csa_conform.explain.patterns.shift import meaningful
from csa_conform.explain.patterns.unwritten import poisoned
from csa_conform.numerics.bits import equal_bits

MOST_ALIASED = 64  # differing rows along an axis that aliasing is checked for (each against every other)


def written_as(reference: np.ndarray, order: tuple[int, ...]) -> np.ndarray:
    """The reference as a reader of its contract layout sees it when the kernel wrote its axes in ``order``."""
    return np.ascontiguousarray(reference.transpose(order)).reshape(reference.shape)


def _name(order: tuple[int, ...], axes: tuple[str, ...]) -> str:
    return "[" + ",".join(axes[axis] if axis < len(axes) else f"a{axis}" for axis in order) + "]"


def layout(stage: str, tensor: str, expected, actual, differ, axes, context: Context) -> Finding | None:
    """The device's bytes are the reference's written with two of its axes exchanged in memory: the exchange
    reproduces the differing elements and leaves every matching one matching (a kernel that writes in another
    order moves every element; one that fits only the differing ones fits by coincidence)."""
    if expected.ndim < 2:
        return None
    differing = int(np.count_nonzero(differ))
    identifying = differ & meaningful(actual)
    for first, second in itertools.combinations(range(expected.ndim), 2):
        if expected.shape[first] < 2 or expected.shape[second] < 2:
            continue
        order = list(range(expected.ndim))
        order[first], order[second] = second, first
        reproduced = equal_bits(written_as(expected, tuple(order)), actual)
        if not reproduced[~differ].all():  # the transform moves a matching element: not how the kernel wrote
            continue
        fits = reproduced & differ
        covered = int(np.count_nonzero(fits))
        support = int(np.count_nonzero(fits & identifying))
        if covered >= 0.9 * differing and support >= MIN_SUPPORT:
            contract, written = _name(tuple(range(expected.ndim)), axes), _name(tuple(order), axes)
            headline = (f"{tensor} holds the reference's values laid out {written} where the contract lays them out "
                        f"{contract}: the kernel wrote (or indexed) axes {axes[first]} and {axes[second]} in the other "
                        f"order; {covered:,} of {differing:,} differing elements match")
            return Finding(LAYOUT, stage, tensor, headline, covered, differing,
                           {"written": written, "contract": contract, "axes": [axes[first], axes[second]],
                            "support": support})
    return None


def aliased(stage: str, tensor: str, expected, actual, differ, axes, context: Context) -> Finding | None:
    """Along one leading axis every differing row k is, whole and bit for bit, the reference's row k′ ≠ k, or
    was never written (a kernel that writes row k′'s data at k's offset leaves k′'s own place as it found it)."""
    differing = int(np.count_nonzero(differ))
    identifying = differ & meaningful(actual)
    unwritten_elements = ~differ | poisoned(actual)
    for axis in range(expected.ndim - 1):
        n = expected.shape[axis]
        if n < 2:
            continue
        others = tuple(i for i in range(expected.ndim) if i != axis)
        rows = np.flatnonzero(differ.any(axis=others))
        if not rows.size or rows.size > MOST_ALIASED or rows.size == n and n > MOST_ALIASED:
            continue
        unwritten = [int(k) for k in rows if np.take(unwritten_elements, k, axis=axis).all()]
        mapping = {}
        for k in rows:
            if k in unwritten:
                continue
            device_row = np.take(actual, k, axis=axis)
            source = next((j for j in range(n) if j != k and equal_bits(np.take(expected, j, axis=axis),
                                                                       device_row).all()), None)
            if source is None:
                break
            mapping[int(k)] = int(source)
        else:
            inside = np.zeros(n, dtype=bool)
            inside[rows] = True
            shape = [1] * expected.ndim
            shape[axis] = n
            covered = int(np.count_nonzero(differ & inside.reshape(shape)))
            inside[unwritten] = False  # poison identifies no source row
            support = int(np.count_nonzero(differ & inside.reshape(shape) & identifying))
            if not mapping or covered < 0.9 * differing or support < MIN_SUPPORT:
                continue
            name = axes[axis] if axis < len(axes) else f"a{axis}"
            pairs = ", ".join(f"{name}={k} holds {name}={j}" for k, j in list(mapping.items())[:6])
            more = f" and {len(mapping) - 6} more" if len(mapping) > 6 else ""
            targets = set(mapping.values())
            common = (f"; every one holds {name}={next(iter(targets))}'s data"
                      if len(targets) == 1 and len(mapping) > 1 else "")
            never = (f"; {name} {spans(unwritten)} never written (still the runner's poison where it differs)"
                     if unwritten else "")
            headline = (f"{tensor} rows alias: {pairs}{more}, whole and bit for bit{common}{never}; {covered:,} of "
                        f"{differing:,} differing elements")
            return Finding(ROW_ALIASING, stage, tensor, headline, covered, differing,
                           {"axis": name, "rows": mapping, "unwritten": unwritten, "support": support})
    return None
