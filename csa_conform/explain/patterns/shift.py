"""Index shifts: element k of the device tensor holds the reference's element k-d.

Window starts, causal counts, record and byte offsets that are off by a few
show as a shift along one axis: most differing elements equal the
reference's neighbour d places before them on that axis. A shift is claimed
only on at least MIN_SUPPORT identifying elements (not fillers) that fit it,
beyond the coincidences its values alone would make (findings.beats_chance).
"""

from __future__ import annotations

import numpy as np

from csa_conform.explain.patterns.findings import (INDEX_SHIFT, MIN_SUPPORT, ROW_ALIASING, Context, Finding,
                                                   beats_chance, chance)
from csa_conform.numerics.bits import equal_bits

LARGEST = 4  # shifts tried: ±1 .. ±LARGEST
# of the rows a shift is claimed in, the share of all their elements (differing or not) the shifted reference
# must reproduce: a real shift moves whole rows, coinciding neighbours move only the elements that differ
WHOLE_ROWS = 0.9
# of the elements a shift moves, the share whose source may keep its own value: a shift moves the sources on too
# (a window off by one), so sources that still hold the reference's values make the values held twice, not moved
KEPT_SOURCES = 0.1
FILLERS = {"f": (-np.inf, 0.0), "i": (-1,), "u": (0,)}  # what an unset element holds; record id 0 is an id


def meaningful(values: np.ndarray) -> np.ndarray:
    """Elements that identify something: not a filler such as -inf, -1 or 0."""
    keep = np.ones(values.shape, bool)
    for filler in FILLERS.get(values.dtype.kind, ()):
        keep &= values != filler
    return keep


def _shifted(expected: np.ndarray, axis: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """(the reference moved d places up ``axis``: element k holds element k-d, where that exists)."""
    moved = np.zeros_like(expected)
    valid = np.zeros(expected.shape, bool)
    n = expected.shape[axis]
    target = [slice(None)] * expected.ndim
    source = [slice(None)] * expected.ndim
    if d > 0:
        target[axis], source[axis] = slice(d, n), slice(0, n - d)
    else:
        target[axis], source[axis] = slice(0, n + d), slice(-d, n)
    moved[tuple(target)] = expected[tuple(source)]
    valid[tuple(target)] = True
    return moved, valid


def index_shift(stage: str, tensor: str, expected, actual, differ, axes, context: Context) -> Finding | None:
    differing = int(np.count_nonzero(differ))
    identifying = differ & meaningful(actual)
    considered = int(np.count_nonzero(identifying))
    if considered < MIN_SUPPORT:
        return None
    per_axis = {}
    for axis in range(expected.ndim):
        if expected.shape[axis] < 3:
            continue
        for d in [step for size in range(1, LARGEST + 1) for step in (-size, size)]:
            if abs(d) >= expected.shape[axis]:
                continue
            moved, valid = _shifted(expected, axis, d)
            fits = equal_bits(moved, actual) & valid & identifying
            count = int(np.count_nonzero(fits))
            if axis not in per_axis or count > per_axis[axis][0]:
                per_axis[axis] = (count, axis, d, fits)
    if not per_axis:
        return None
    best = max(per_axis.values(), key=lambda found: found[0])
    last = per_axis.get(expected.ndim - 1)
    if last is not None and last[0] >= 0.9 * considered:
        best = last  # a shift within the row (slots, bytes) says more than one across rows
    if best[0] < max(0.75 * considered, MIN_SUPPORT):
        return None
    count, axis, d, fits = best
    if np.count_nonzero(fits.any(axis=tuple(i for i in range(fits.ndim) if i != axis))) < 2:
        return None  # one index moved is one alias (layout.aliased states it), not a shift of every k
    coincidences = chance(expected, actual, identifying, axis)
    if not beats_chance(count, coincidences, considered):
        return None
    moved, valid = _shifted(expected, axis, d)
    claimed = valid & np.expand_dims(fits.any(axis=axis), axis)
    if np.count_nonzero(equal_bits(moved, actual) & claimed) < WHOLE_ROWS * np.count_nonzero(claimed):
        return None  # the matching elements of those rows do not follow the shift: neighbours that coincide
    name = axes[axis] if axis < len(axes) else f"a{axis}"
    rows = int(np.count_nonzero(fits.any(axis=axis))) if expected.ndim > 1 else 1
    sign = "-" if d > 0 else "+"
    held = (f"device {name}=k holds the reference's {name}=k{sign}{abs(d)} in {count:,} of {considered:,} differing "
            f"elements (not counting fillers: -inf, -1, 0), across {rows:,} row{'s' if rows != 1 else ''}")
    evidence = {"axis": name, "shift": -d, "matched": count, "considered": considered, "rows": rows,
                "support": count, "chance": round(coincidences, 2)}
    sources, _ = _shifted(fits, axis, -d)
    if np.count_nonzero(sources & differ) <= KEPT_SOURCES * count:
        headline = (f"{tensor} holds values twice along {name}: {held}, and {name}=k{sign}{abs(d)} keeps them too "
                    f"(written at both places, or left at {name}=k from before: not a shift, which would move them on)")
        return Finding(ROW_ALIASING, stage, tensor, headline, count, differing, {**evidence, "twice": True})
    headline = f"{tensor} is shifted along {name}: {held}"
    return Finding(INDEX_SHIFT, stage, tensor, headline, count, differing, evidence)
