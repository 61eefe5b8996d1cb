"""Restriction patterns: the divergence is confined to some rows, or to exactly the rows where a
predicate holds.

A batch-offset bug is wrong only at b >= 1; a causal-count bug only where a
block completes at the query's position; a RoPE bug only in the rope tail
of a record; a sink taken into the running max only in the rows whose sink
logit is above every candidate's score. The detector lists, per axis, the
indices that hold a difference when they are not all of them (an observation:
"the 6 elements of Y that differ sit at b = 1, s = 7"), names the ones that
match a predicate of the step's geometry when the predicate holds on at least
two indices and at least MIN_SUPPORT elements differ (a few elements fit some
predicate by coincidence), and says when the device holds one value (-inf, 0,
-1, NaN) in every differing element.
"""

from __future__ import annotations

import numpy as np

from csa_conform.explain.patterns.findings import MIN_SUPPORT, RESTRICTED, Context, Finding, spans
from csa_conform.numerics.bits import unsigned
from csa_conform.numerics.records import FP8_RECORD_BYTES

ROW_AXES = ("b", "s", "h", "i")
LARGEST_POWER = 30
MOST_RANGES = 6  # an axis's differing indices in more ranges than this are counted, not listed, in a headline


def _hit(differ: np.ndarray, axis: int) -> np.ndarray:
    others = tuple(i for i in range(differ.ndim) if i != axis)
    return differ.any(axis=others) if others else differ


def _position_predicates(hit: np.ndarray, context: Context) -> list[str]:
    """Names of predicates on the query position that hold exactly at the differing s."""
    g = context.geometry
    if g is None:
        return []
    positions = g.start + np.arange(hit.size)
    found = []
    completes = (positions + 1) % g.ratio == 0
    if completes.any() and np.array_equal(hit, completes):
        found.append(f"a block completes at the query's position ((position+1) % {g.ratio} == 0)")
    for k in range(LARGEST_POWER):
        beyond = positions >= 2**k
        if beyond.any() and not beyond.all() and np.array_equal(hit, beyond):
            found.append(f"position >= 2^{k} = {2**k}")
    if hit.size > 1 and hit[-1] and not hit[:-1].any():
        found.append("the last query of the step")
    if hit.size > 1 and hit[0] and not hit[1:].any():
        found.append("the first query of the step")
    return found


def _axis_predicates(name: str, hit: np.ndarray, tensor: str, context: Context) -> list[str]:
    g = context.geometry
    found = []
    if name == "b" and hit.size > 1 and not hit[0] and hit[1:].all():
        found.append("batch rows b >= 1 (b = 0 is right)")
    if name == "s":
        found += _position_predicates(hit, context)
    if name in ("r",) and hit.size > 1:
        if hit[0] and not hit[1:].any():
            found.append("the first record")
        past = context.inputs.get("past_index_key" if context.stage == "index_key_update" else "past_compressed_kv")
        kept = int(np.asarray(past).shape[1]) if past is not None else 0
        if 0 < kept < hit.size and not hit[:kept].any():
            found.append(f"records completed in this step (r >= {kept}; the {kept} past records are right)")
    if g is not None and name in ("d", "byte") and hit.any():
        lowest = int(np.flatnonzero(hit)[0])
        width = hit.size
        tail = {"d": width - g.rope_dim, "byte": width - 2 * g.rope_dim}[name]
        if tail > 0 and lowest >= tail and hit.size in (g.dim, g.index_dim, FP8_RECORD_BYTES):
            found.append(f"the RoPE tail ({name} >= {tail})")
    return found


def _last_causal_record(differ: np.ndarray, axes: tuple[str, ...], context: Context) -> list[str]:
    """Index scores: every differing element is its row's last causal record, c = (position+1)/R - 1."""
    g = context.geometry
    if g is None or axes != ("b", "s", "c"):
        return []
    last = (g.start + np.arange(differ.shape[1]) + 1) // g.ratio - 1
    at_last = np.zeros(differ.shape, bool)
    rows = np.flatnonzero((last >= 0) & (last < differ.shape[2]))
    at_last[:, rows, last[rows]] = True
    if differ.any(axis=-1).sum() >= 2 and not (differ & ~at_last).any():  # one row is a place, not a rule
        return [f"the row's last causal record (c = (position+1)/{g.ratio} - 1)"]
    return []


def _row_predicates(tensor: str, differ: np.ndarray, axes: tuple[str, ...], context: Context) -> list[str]:
    """Row-level predicates: the last causal record of index scores; in attention the sink logit above
    every candidate's score."""
    if context.stage == "index_scoring":
        return _last_causal_record(differ, axes, context)
    if context.stage != "sparse_sink_softmax_attention" or axes[:3] != ("b", "s", "h"):
        return []
    scores = context.expected.get("sparse_sink_softmax_attention", {}).get("scores")
    sink = context.inputs.get("head_sink")
    if scores is None or sink is None:
        return []
    rows = differ.reshape(differ.shape[:3] + (-1,)).any(axis=-1)
    maximum = np.max(np.asarray(scores), axis=-1)
    above = (np.asarray(sink, np.float32)[None, None, :] > maximum) & np.isfinite(maximum)
    found = []
    if rows.sum() >= 2 and np.array_equal(rows, above):  # one row is a place, not a rule
        found.append(f"the sink logit is above every candidate's score (the {int(above.sum()):,} rows where "
                     "sink > row max, and no other)")
    return found


def restricted(stage: str, tensor: str, expected, actual, differ, axes, context: Context) -> Finding | None:
    """Where the differences sit: per axis the indices that hold one, as an observation; a named predicate
    only when it holds on at least two indices of its axis (one index is a place, not a rule) and the tensor
    has at least MIN_SUPPORT differing elements (on fewer any predicate fits by coincidence)."""
    differing = int(np.count_nonzero(differ))
    where: dict[str, str] = {}
    named: list[str] = []
    unnamed: list[str] = []
    enough = differing >= MIN_SUPPORT
    for axis, name in enumerate(axes):
        hit = _hit(differ, axis)
        predicates = _axis_predicates(name, hit, tensor, context) if enough and hit.sum() >= 2 else []
        if hit.size > 1 and not hit.all():
            where[name] = spans(np.flatnonzero(hit))
            if not predicates:
                listed = where[name]
                if listed.count(",") >= MOST_RANGES:  # a scatter: how many, not which
                    listed = f"{int(hit.sum()):,} of {hit.size:,} indices"
                unnamed.append(f"{name} = {listed}" if "indices" not in listed else f"{name}: {listed}")
        named += predicates
    rows = _row_predicates(tensor, differ, axes, context) if enough else []
    named += rows
    values = np.unique(unsigned(actual[differ]))
    value = None
    if values.size == 1:
        value = actual[differ].reshape(-1)[0]
        value = ("nan" if np.isnan(value) else str(value)) if actual.dtype.kind == "f" else str(int(value))
    if not where and not named and value is None:
        return None
    count = f"{differing:,} element{'s' if differing != 1 else ''}"
    if named:
        parts = named + ([] if rows else unnamed)
        headline = f"{tensor} differs only where " + " and ".join(parts) + f": {count}"
    elif unnamed:
        headline = f"the {count} of {tensor} that differ sit at {', '.join(unnamed)}"
    else:
        headline = f"{tensor} differs: {count}"
    if value is not None:
        headline += f", where the device holds {value} in every one"
    return Finding(RESTRICTED, stage, tensor, headline, differing, differing,
                   {"where": where, "predicates": named, "value": value})
