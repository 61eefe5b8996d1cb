"""Constant factors: device = reference × c for one simple c.

A folded or missing scale (1/sqrt(I) left out, 1/sqrt(a·b) for
1/sqrt(a)/sqrt(b), a doubled normaliser) multiplies every affected value by
the same constant, up to the roundings after it. One row scaled by a constant
is no evidence of a scale (a softmax denominator or a norm that changed does
that to its row), so the constant must hold across at least two rows; it is
a fit within SPREAD, never more than moderate evidence: its simple form is
stated, the cause (a folded or missing scale, a changed normalizer) is left to
the re-runs that reproduce it.
"""

from __future__ import annotations

import math

import numpy as np

from csa_conform.explain.patterns.findings import CONSTANT_FACTOR, MIN_SUPPORT, Context, Finding

SPREAD = 2.0**-16  # relative spread of the ratios still called one constant
NOISE = 2.0**-10  # a factor this close to 1 without a simple form is rounding noise, not a scale


def _names(context: Context) -> dict[str, int]:
    g = context.geometry
    names = {"2": 2}
    if g is not None:
        for what in ("heads", "index_heads", "dim", "index_dim", "rope_dim", "ratio", "topk_width"):
            value = getattr(g, what, None)
            if isinstance(value, int) and value > 1:
                names.setdefault(what, value)
    return names


def simple_form(c: float, context: Context) -> str | None:
    """c as n, 1/n, sqrt(n) or 1/sqrt(n) of a geometry extent (or of 2), within SPREAD."""
    for name, n in _names(context).items():
        for text, value in ((name, n), (f"1/{name}", 1 / n), (f"sqrt({name})", math.sqrt(n)),
                            (f"1/sqrt({name})", 1 / math.sqrt(n))):
            if abs(c / value - 1) <= SPREAD:
                return f"{text} = {value:.9g}" if name != "2" else text
    return None


def constant_factor(stage: str, tensor: str, expected, actual, differ, axes, context: Context) -> Finding | None:
    if expected.dtype.kind != "f":
        return None
    use = differ & np.isfinite(expected) & np.isfinite(actual) & (expected != 0)
    count = int(np.count_nonzero(use))
    if not count:
        return None
    ratios = actual[use].astype(np.float64) / expected[use].astype(np.float64)
    c = float(np.median(ratios))
    if c == 0 or not np.all(np.abs(ratios / c - 1) <= SPREAD):
        return None
    differing = int(np.count_nonzero(differ))
    form = simple_form(c, context)
    # a few elements are a constant only in a simple form
    if form is None and (abs(c - 1) <= NOISE or count < MIN_SUPPORT):
        return None
    # one row scaled by one constant is what any change of a normalizer does (a softmax denominator, a norm):
    # a constant is evidence of a scale only across rows
    rows = _rows(use)
    if rows < 2:
        return None
    spread = float(np.max(np.abs(ratios / c - 1)))
    named = f" (c = {form}, a simple form)" if form else ""
    headline = (f"{tensor} is the reference's times a constant: device = reference × {c:.9g} in {count:,} "
                f"of {differing:,} differing elements across {rows:,} rows (spread {spread:.1e}){named}")
    return Finding(CONSTANT_FACTOR, stage, tensor, headline, count, differing,
                   {"factor": c, "form": form, "spread": spread, "elements": count, "rows": rows})


def _rows(use: np.ndarray) -> int:
    """The rows (all axes but the last) that hold a used element."""
    return int(np.count_nonzero(use.reshape(-1, use.shape[-1]).any(axis=-1))) if use.ndim > 1 else int(use.any())
