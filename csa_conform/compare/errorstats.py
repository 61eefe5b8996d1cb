"""Error statistics of one tensor against another, as peers report them (not only a verdict).

``TensorErrors`` accumulates, over any number of steps of a suite, the
element-wise errors of an ``actual`` tensor against an ``expected`` one:
absolute, relative (where the expected value is non-zero) and ULP error of the
finite elements both sides share, their max / mean / median / p99 / p99.9,
the cosine distance per step, the elements whose -inf mask differs, and for
index tensors the per-row set overlap and rank changes; for Y the per-row
argmax identity. ``gap`` (two profiles), ``calibrate`` and
``diff --tolerance`` (a device against the goldens) all use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from csa_conform.compare.placement import log2_histogram
from csa_conform.numerics.bits import ordered, unsigned
from csa_conform.profiles.numerics import OFFICIAL, REFERENCE
from csa_conform.spec import STAGE_NAMES, Mode

QUANTILES = {"median": 50.0, "p99": 99.0, "p99.9": 99.9}
MEASURES = ("abs", "rel", "ulp")


def ordered_bits(values: np.ndarray) -> np.ndarray:
    """binary32 bit patterns as integers ordered like the values (-0 and +0 adjacent)."""
    return ordered(unsigned(np.asarray(values, dtype=np.float32)))


def summary(values: np.ndarray) -> dict:
    if values.size == 0:
        return {"max": 0.0, "mean": 0.0, **{name: 0.0 for name in QUANTILES}}
    result = {"max": float(values.max()), "mean": float(values.mean())}
    for name, q in QUANTILES.items():
        result[name] = float(np.percentile(values, q))
    return result


def cosine_distance(expected: np.ndarray, actual: np.ndarray) -> float:
    """1 - x·y / (|x| |y|) in float64; 0 when both are zero, 1 when only one is."""
    x, y = expected.astype(np.float64), actual.astype(np.float64)
    norms = np.sqrt((x * x).sum() * (y * y).sum())
    if norms == 0:
        return 0.0 if not (x.any() or y.any()) else 1.0
    return float(max(0.0, 1.0 - (x * y).sum() / norms))


@dataclass
class TensorErrors:
    """One stage/tensor's errors over a suite; ``add`` one step's pair of arrays at a time."""

    stage: str
    tensor: str
    kind: str = ""  # float, bytes or index
    steps: int = 0
    steps_identical: int = 0
    elements: int = 0
    identical: int = 0
    mask_mismatches: int = 0
    cosine_max: float = 0.0
    rows: int = 0
    rows_identical: int = 0
    overlap_min: float = 1.0
    overlap_sum: float = 0.0
    rank_changes: int = 0
    argmax_rows: int = 0
    argmax_identical: int = 0
    worst: dict = field(default_factory=dict)
    _errors: dict = field(default_factory=lambda: {measure: [] for measure in MEASURES})

    def add(self, expected: np.ndarray, actual: np.ndarray, where: str = "") -> None:
        if expected.shape != actual.shape or expected.dtype != actual.dtype:
            raise ValueError(f"{self.stage}/{self.tensor}: {actual.dtype}{list(actual.shape)} against "
                             f"{expected.dtype}{list(expected.shape)}")
        self.kind = _kind(expected)
        self.steps += 1
        self.elements += expected.size
        width = expected.dtype.itemsize
        same = np.ascontiguousarray(expected).view(np.uint8).reshape(-1, width) == \
            np.ascontiguousarray(actual).view(np.uint8).reshape(-1, width)
        equal = int(same.all(axis=-1).sum())
        self.identical += equal
        self.steps_identical += equal == expected.size
        if expected.size == 0:
            return
        if self.kind == "float":
            self._add_float(expected, actual, where)
        elif self.kind == "index":
            self._add_index(expected, actual)

    def _add_float(self, expected, actual, where: str) -> None:
        neg_e, neg_a = np.isneginf(expected), np.isneginf(actual)
        self.mask_mismatches += int((neg_e != neg_a).sum())
        both = np.isfinite(expected) & np.isfinite(actual)
        e, a = expected[both].astype(np.float64), actual[both].astype(np.float64)
        absolute = np.abs(a - e)
        nonzero = e != 0
        self._errors["abs"].append(absolute)
        self._errors["rel"].append(absolute[nonzero] / np.abs(e[nonzero]))
        self._errors["ulp"].append(np.abs(ordered_bits(expected[both]) - ordered_bits(actual[both])).astype(np.float64))
        if absolute.size and absolute.max() > self.worst.get("abs", -1.0):
            self.worst = {"abs": float(absolute.max()), "where": where}
        self.cosine_max = max(self.cosine_max, cosine_distance(e, a))
        if self.tensor == "Y" and expected.ndim >= 2:
            rows_e = expected.reshape(-1, expected.shape[-1])
            rows_a = actual.reshape(-1, actual.shape[-1])
            live = rows_e.any(axis=-1) | rows_a.any(axis=-1)
            self.argmax_rows += int(live.sum())
            self.argmax_identical += int((rows_e.argmax(-1) == rows_a.argmax(-1))[live].sum())

    def _add_index(self, expected, actual) -> None:
        rows_e = expected.reshape(-1, expected.shape[-1] if expected.ndim else 1)
        rows_a = actual.reshape(rows_e.shape)
        for row_e, row_a in zip(rows_e, rows_a):
            set_e, set_a = set(row_e[row_e >= 0].tolist()), set(row_a[row_a >= 0].tolist())
            size = max(len(set_e), len(set_a))
            overlap = 1.0 if size == 0 else len(set_e & set_a) / size
            self.rows += 1
            self.rows_identical += bool(np.array_equal(row_e, row_a))
            self.overlap_min = min(self.overlap_min, overlap)
            self.overlap_sum += overlap
            self.rank_changes += int((row_e != row_a).sum())

    def merge(self, other: TensorErrors) -> None:
        """Fold in the errors another process (or case) measured on the same stage and tensor."""
        self.kind = self.kind or other.kind
        for name in ("steps", "steps_identical", "elements", "identical", "mask_mismatches", "rows",
                     "rows_identical", "overlap_sum", "rank_changes", "argmax_rows", "argmax_identical"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.cosine_max = max(self.cosine_max, other.cosine_max)
        self.overlap_min = min(self.overlap_min, other.overlap_min)
        if other.worst.get("abs", -1.0) > self.worst.get("abs", -1.0):
            self.worst = dict(other.worst)
        for measure in MEASURES:
            self._errors[measure].extend(other._errors[measure])

    def errors(self, measure: str) -> np.ndarray:
        parts = self._errors[measure]
        return np.concatenate(parts) if parts else np.zeros(0)

    def entry(self) -> dict:
        """The JSON form: counts, then the statistics that apply to the tensor's kind."""
        entry = {
            "stage": self.stage, "tensor": self.tensor, "kind": self.kind,
            "steps": self.steps, "steps_identical": self.steps_identical,
            "elements": self.elements, "identical": self.identical,
        }
        if self.kind == "float":
            entry.update({measure: summary(self.errors(measure)) for measure in MEASURES})
            entry["cosine_distance_max"] = self.cosine_max
            entry["neginf_mask_mismatches"] = self.mask_mismatches
            entry["worst"] = self.worst
            entry["histogram"] = log2_histogram(self.errors("abs"))
            if self.argmax_rows:
                entry["argmax"] = {"rows": self.argmax_rows, "identical": self.argmax_identical}
        elif self.kind == "index":
            entry["sets"] = {
                "rows": self.rows, "rows_identical": self.rows_identical,
                "overlap_min": self.overlap_min if self.rows else 1.0,
                "overlap_mean": self.overlap_sum / self.rows if self.rows else 1.0,
                "rank_changes": self.rank_changes,
            }
        return entry


def _kind(array: np.ndarray) -> str:
    if array.dtype == np.float32:
        return "float"
    if array.dtype == np.uint8:
        return "bytes"
    return "index"


SKIPPED_STAGES = ("writeback",)
CHAINED, ISOLATED = Mode.CHAINED.value, Mode.ISOLATED.value
MODES = (CHAINED, ISOLATED)


@dataclass
class Gap:
    """The aggregated comparison of two profiles over one or more files."""

    expected: str = REFERENCE
    actual: str = OFFICIAL
    mode: str = CHAINED
    tensors: dict = field(default_factory=dict)  # (stage, tensor) -> TensorErrors
    steps: int = 0
    compared: int = 0
    rejected_both: int = 0
    rejected_expected_only: int = 0
    rejected_actual_only: int = 0
    cases: list = field(default_factory=list)

    def add_step(self, case_id: str, index: int, expected: dict, actual: dict) -> None:
        self.compared += 1
        for stage in STAGE_NAMES:
            if stage in SKIPPED_STAGES or stage not in expected or stage not in actual:
                continue
            for tensor, value in expected[stage].items():
                other = actual[stage].get(tensor)
                if other is None or other.shape != value.shape or other.dtype != value.dtype:
                    continue  # a missing or misshapen tensor is the bit-exact gate's finding
                errors = self.tensors.setdefault((stage, tensor), TensorErrors(stage, tensor))
                errors.add(value, other, f"{case_id} step {index}")

    def merge(self, other: Gap) -> None:
        for key, errors in other.tensors.items():
            if key in self.tensors:
                self.tensors[key].merge(errors)
            else:
                self.tensors[key] = errors
        for name in ("steps", "compared", "rejected_both", "rejected_expected_only", "rejected_actual_only"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.cases += other.cases

    def rows(self) -> list[TensorErrors]:
        order = {name: position for position, name in enumerate(STAGE_NAMES)}
        return sorted(self.tensors.values(), key=lambda errors: (order[errors.stage], errors.tensor))

    def entry(self) -> dict:
        return {
            "expected_profile": self.expected,
            "actual_profile": self.actual,
            "mode": self.mode,
            "steps": self.steps,
            "compared_steps": self.compared,
            "rejected": {
                "both": self.rejected_both,
                f"{self.expected}_only": self.rejected_expected_only,
                f"{self.actual}_only": self.rejected_actual_only,
            },
            "tensors": [errors.entry() for errors in self.rows()],
        }
