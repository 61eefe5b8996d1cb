"""``bench --devices 0,1,…|all``: every case benchmarked on every listed GPU, one worker process each, and
the GPU whose step times stand out flagged.

Each worker sees only its GPU (CUDA_VISIBLE_DEVICES set before anything there touches CUDA, as for
``diff --devices``: csa_conform.device.devices) and runs the whole job there (csa_conform.bench.run);
the workers run at the same time, through the package's one pool (csa_conform._base.pool).

The outlier rule, per case, on the medians of the whole step (the ``step`` row) of the devices that
timed it: device d is an outlier when its median lies outside the range [lo, hi] of the other
devices' medians by more than max(3% of their median, hi - lo), i.e. further from the others than
they are from each other and than the gate's smallest change. It needs at least three devices: of
two that differ, neither can be told the odd one (the run says so). A device is flagged with every
case it stands out on; a flag is reported, never an exit status of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import numpy as np

from csa_conform._base.pool import ordered_map
from csa_conform.bench.gate import MIN_CHANGE
from csa_conform.bench.measure import STEP_ROW
from csa_conform.bench.run import BenchJob, DeviceRun, run_device
from csa_conform.device import cuda
from csa_conform.device.devices import own_device, visible_device

MIN_DEVICES = 3


@dataclass(frozen=True)
class Outlier:
    """One device's step median on one case, outside the others' by more than the margin."""

    device: int
    case: str
    median_s: float
    low_s: float
    high_s: float
    margin_s: float

    @property
    def reason(self) -> str:
        return (f"{self.case}: step median {self.median_s * 1e3:.4f} ms, the other devices' "
                f"{self.low_s * 1e3:.4f}–{self.high_s * 1e3:.4f} ms (margin {self.margin_s * 1e3:.4f} ms)")

    def to_dict(self) -> dict:
        return {"device": self.device, "case": self.case, "median_s": self.median_s,
                "others_s": [self.low_s, self.high_s], "margin_s": self.margin_s, "reason": self.reason}


def outliers(medians: Mapping[str, Mapping[int, float]]) -> list[Outlier]:
    """The rule above over ``medians`` (case -> device -> step median, seconds), in case then device order."""
    found = []
    for case, by_device in medians.items():
        if len(by_device) < MIN_DEVICES:
            continue
        for device, median in by_device.items():
            others = np.array([value for other, value in by_device.items() if other != device])
            low, high = float(others.min()), float(others.max())
            margin = max(MIN_CHANGE * float(np.median(others)), high - low)
            if median > high + margin or median < low - margin:
                found.append(Outlier(device, case, median, low, high, margin))
    return found


def step_medians(runs: Sequence[DeviceRun]) -> dict[str, dict[int, float]]:
    """case -> device -> the median of its timed ``step`` row."""
    medians: dict[str, dict[int, float]] = {}
    for run in runs:
        for bench in run.benches:
            step = next((row for row in bench.rows if row.name == STEP_ROW and row.timed), None)
            if step is not None and step.samples is not None:
                device = 0 if run.device is None else run.device
                medians.setdefault(bench.case, {})[device] = step.samples.summary().median
    return medians


def _worker(share: tuple[int, str, BenchJob]) -> DeviceRun:
    device, visible, job = share
    own_device(visible)
    return replace(run_device(job), device=device)


def run_devices(devices: Sequence[int], job: BenchJob) -> list[DeviceRun]:
    """``job`` on every device at once, one worker each; the runs in the order of ``devices``."""
    shares = [(device, visible_device(device), job) for device in devices]
    method = "spawn" if cuda.initialised else "fork"
    return list(ordered_map(_worker, shares, len(shares), method=method,
                            crashed="a --devices worker process died before finishing; rerun without --devices"))


def devices_section(runs: Sequence[DeviceRun], sections: Sequence[dict]) -> dict:
    """The ``devices`` part of the bench section: each device's own section, the outliers and the rule's note."""
    found = outliers(step_medians(runs))
    return {
        "runs": [{"device": run.device, "name": run.provenance.device.name if run.provenance.device else None,
                  **section} for run, section in zip(runs, sections)],
        "outliers": [outlier.to_dict() for outlier in found],
        "rule": (f"per case, a device whose step median lies outside the other devices' range by more than "
                 f"max({MIN_CHANGE:.0%} of their median, their range); needs {MIN_DEVICES} devices"
                 + ("" if len(runs) >= MIN_DEVICES else f": with {len(runs)}, none is flagged")),
    }
