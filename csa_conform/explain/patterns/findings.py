"""The findings a structural detector returns, their vocabulary, and the helpers every detector shares."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping

import numpy as np

from csa_conform.contract import StepGeometry
from csa_conform.explain.claims import FIT, OBSERVATION, RERUN, TRANSFORM, confidence_of

# The vocabulary, strongest first: the kinds before RESTRICTED say what the bug is; RESTRICTED says
# where it is (and is what remains when nothing more specific fits).
NEVER_WRITTEN = "never-written"
GUARD_READ = "guard-read"
STALE = "stale"
PERMUTATION = "permutation"
INDEX_SHIFT = "index-shift"
LAYOUT = "layout"
ROW_ALIASING = "row-aliasing"
SCALE_EXPONENT = "scale-exponent"
SUB_STEP = "sub-step"
ROUNDING_CONVENTION = "rounding-convention"
CONSTANT_FACTOR = "constant-factor"
RESTRICTED = "restricted"
KINDS = (NEVER_WRITTEN, GUARD_READ, STALE, LAYOUT, PERMUTATION, INDEX_SHIFT, ROW_ALIASING, SCALE_EXPONENT,
         SUB_STEP, ROUNDING_CONVENTION, CONSTANT_FACTOR, RESTRICTED)
# Kinds that no numeric ingredient (libm, FMA, flush-to-zero) can produce: explain skips its numeric search.
STRUCTURAL = frozenset({NEVER_WRITTEN, GUARD_READ, STALE, LAYOUT, ROW_ALIASING, PERMUTATION, INDEX_SHIFT,
                        SCALE_EXPONENT, SUB_STEP, ROUNDING_CONVENTION})
# A finding accounts for its tensor when it covers at least this share of the differing elements.
DECISIVE = 0.9
# A pattern (a permutation, an index shift, row aliasing, a stale copy, a scale exponent, a constant factor of
# no simple form) is claimed only on at least this many differing elements it matches: on fewer, a
# coincidence is too likely, and what remains is an observation of where the differences sit.
MIN_SUPPORT = 8
# What established each kind when a detector claims it (csa_conform.explain.claims): the reference's payload
# under the kind's transform is the device's bit for bit, a fit within bounds, or a fact about the bytes.
SOURCE = {NEVER_WRITTEN: TRANSFORM, GUARD_READ: TRANSFORM, STALE: TRANSFORM, LAYOUT: TRANSFORM,
          PERMUTATION: TRANSFORM, INDEX_SHIFT: TRANSFORM, ROW_ALIASING: TRANSFORM, SCALE_EXPONENT: TRANSFORM,
          SUB_STEP: FIT, ROUNDING_CONVENTION: RERUN, CONSTANT_FACTOR: FIT, RESTRICTED: OBSERVATION}


@dataclass(frozen=True)
class Finding:
    """One diagnosis: ``covered`` of the tensor's ``differing`` elements fit the pattern."""

    kind: str
    stage: str
    tensor: str
    headline: str
    covered: int
    differing: int
    evidence: dict = field(default_factory=dict)
    source: str = ""  # csa_conform.explain.claims: what established it; empty: the kind's usual SOURCE

    @property
    def established_by(self) -> str:
        return self.source or SOURCE[self.kind]

    @property
    def decisive(self) -> bool:
        return self.differing > 0 and self.covered >= DECISIVE * self.differing

    @property
    def support(self) -> int:
        """The independent elements (or changed arguments, for a re-run) the finding rests on."""
        return int(self.evidence.get("support", self.covered))

    @property
    def confidence(self) -> str:
        return confidence_of(self.support, self.established_by)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "stage": self.stage, "tensor": self.tensor, "headline": self.headline,
                "covered": self.covered, "differing": self.differing, "support": self.support,
                "confidence": self.confidence, "source": self.established_by, "evidence": self.evidence}


@dataclass
class Context:
    """What a detector may read besides the two tensors: the step's geometry and inputs, the
    reference's payloads of every stage, and the oracle's intermediates of this stage (a trace,
    computed on first use)."""

    stage: str
    geometry: StepGeometry | None = None
    inputs: Mapping[str, np.ndarray] = field(default_factory=dict)
    expected: Mapping[str, Mapping[str, np.ndarray]] = field(default_factory=dict)
    tracer: Callable[[], dict] | None = None
    _trace: dict | None = None

    def trace(self) -> dict:
        if self._trace is None:
            self._trace = self.tracer() if self.tracer is not None else {}
        return self._trace


# A pattern beats chance when it fits at least MIN_SUPPORT elements, at least OVER_CHANCE times the
# coincidences expected of its values, and so many that coincidences alone make that many with a probability
# below CHANCE (a binomial tail at the mean coincidence rate).
OVER_CHANCE = 2
CHANCE = 1e-3
CHANCE_CHUNK = 1 << 22  # elements compared at once when counting coincidences


def chance(reference: np.ndarray, device: np.ndarray, mask: np.ndarray, axis: int = -1) -> float:
    """The coincidences expected among the elements ``mask`` selects: for each, the share of the reference's
    elements along ``axis`` (the same other coordinates) that hold the device's value there bit for bit. A
    transform that moves values along that axis fits about this many elements by chance alone."""
    if not mask.any():
        return 0.0
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[reference.dtype.itemsize]
    rows = np.moveaxis(np.ascontiguousarray(reference).view(width), axis, -1)
    picked = np.moveaxis(mask, axis, -1)
    values = np.moveaxis(np.ascontiguousarray(device).view(width), axis, -1)[picked]
    lines = rows[picked.any(axis=-1)] if rows.ndim > 1 else rows[None]
    index = np.cumsum(picked.any(axis=-1).reshape(-1)) - 1
    owner = np.broadcast_to(index.reshape(picked.shape[:-1] + (1,)), picked.shape)[picked] if rows.ndim > 1 else \
        np.zeros(values.size, dtype=np.int64)
    step = max(1, CHANCE_CHUNK // max(1, rows.shape[-1]))
    total = 0.0
    for start in range(0, values.size, step):
        chunk = slice(start, start + step)
        total += float((lines[owner[chunk]] == values[chunk, None]).mean(axis=-1).sum())
    return total


def beats_chance(fits: int, expected: float, considered: int) -> bool:
    """``fits`` of ``considered`` elements matching a pattern are more than the ``expected`` coincidences make."""
    if fits < MIN_SUPPORT or fits < OVER_CHANCE * expected:
        return False
    rate = min(max(expected / max(considered, 1), 0.0), 1.0)
    return _binomial_tail(considered, fits, rate) < CHANCE


def _binomial_tail(n: int, k: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), summed in logs (n is at most a tensor's element count)."""
    if p <= 0.0:
        return 0.0 if k > 0 else 1.0
    if p >= 1.0:
        return 1.0
    terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * math.log(p)
             + (n - i) * math.log1p(-p) for i in range(k, min(n, k + 2000) + 1)]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def coordinates(flat: int, shape: tuple, axes: tuple[str, ...]) -> str:
    index = np.unravel_index(flat, shape) if shape else ()
    return " ".join(f"{name}={int(i)}" for name, i in zip(axes, index))


def spans(indices) -> str:
    """Sorted integers as compact ranges: '0..3, 7, 9..12'."""
    values = sorted(int(i) for i in indices)
    parts: list[str] = []
    start = previous = None
    for value in values:
        if start is None:
            start = previous = value
        elif value == previous + 1:
            previous = value
        else:
            parts.append(f"{start}" if start == previous else f"{start}..{previous}")
            start = previous = value
    if start is not None:
        parts.append(f"{start}" if start == previous else f"{start}..{previous}")
    return ", ".join(parts)


def comparable(expected: Mapping[str, np.ndarray],
               actual: Mapping[str, np.ndarray]) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """(tensor, reference, device) of every non-empty tensor both payloads hold with one shape and dtype: the
    pairs whose elements can be compared one for one."""
    for tensor, reference in expected.items():
        device = actual.get(tensor)
        if device is None:
            continue
        reference, device = np.asarray(reference), np.asarray(device)
        if reference.shape == device.shape and reference.dtype == device.dtype and reference.size:
            yield tensor, reference, device
