"""One bench run on one device: every case benchmarked on the new kernels (and the baseline kernels).

``run_device`` is what ``csa-conform bench`` does in its own process, and what each ``--devices``
worker does on its GPU (csa_conform.bench.devices): the same job, a different CUDA_VISIBLE_DEVICES.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Mapping

from csa_conform.bench.measure import BenchOptions, CaseBench, Subject, bench_case
from csa_conform.bench.roofline import nominal_peaks
from csa_conform.bench.samples import Samples
from csa_conform.bench.timers import AUTO
from csa_conform.device.backend import backend_named
from csa_conform.device.kernels import KernelDirectory
from csa_conform.device.provenance import RunProvenance
from csa_conform.golden import GoldenFile


@dataclass(frozen=True)
class BenchJob:
    """What to benchmark: the cases of a golden file, the kernel directories, the backend and the options."""

    file: str
    cases: tuple[str, ...]
    kernels: str | None
    profile: str | None
    backend: str
    options: BenchOptions
    baseline_kernels: str | None = None
    recorded: Mapping[tuple[str, str], Samples] | None = None
    timer: str = AUTO  # --timer: auto, cupti or events (csa_conform.bench.timers)


@dataclass
class DeviceRun:
    """One device's results: each case's rows, the timer, the peaks and the new kernels' provenance."""

    benches: list[CaseBench]
    timer: str | None
    peaks: tuple[dict | None, dict | None]
    provenance: RunProvenance
    persisting_l2: str | None = None
    timer_fallback: str | None = None
    device: int | None = None  # the --devices ordinal; None for the one device of a plain run


def run_device(job: BenchJob, wrap: Callable[[Iterator[CaseBench]], Iterable[CaseBench]] = list) -> DeviceRun:
    """Every case of ``job`` benchmarked here; ``wrap`` sees the cases as they finish (a progress bar)."""
    factory = backend_named(job.backend)
    subjects = [Subject(KernelDirectory(job.kernels, build=job.profile), factory, job.timer)]
    if job.baseline_kernels:
        subjects.append(Subject(KernelDirectory(job.baseline_kernels, build=job.profile), factory, job.timer))
    peaks_cache: dict = {}

    def peaks():
        if "peaks" not in peaks_cache:
            runner = subjects[0].runner
            device = runner.provenance.device
            peaks_cache["peaks"] = (nominal_peaks(device.name if device else None),
                                    subjects[0].timer.measured_peaks() if runner.recorder is not None else None)
        return peaks_cache["peaks"]

    with GoldenFile(job.file) as golden:
        benches = list(wrap(bench_case(golden, case, subjects, job.options, job.recorded, peaks)
                            for case in job.cases))
    for subject in subjects:
        subject.close()
    return DeviceRun(benches, subjects[0].timer_name, peaks_cache.get("peaks", (None, None)),
                     subjects[0].runner.provenance, subjects[0].persisting_l2, subjects[0].timer_fallback)
