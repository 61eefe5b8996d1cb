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
from csa_conform.check.conformance import check_case
from csa_conform.check.model import CaseVerdict
from csa_conform.device.backend import backend_named
from csa_conform.device.kernels import KernelDirectory
from csa_conform.device.provenance import RunProvenance
from csa_conform.device.runner import DeviceRunner
from csa_conform.golden import GoldenFile
from csa_conform.spec import STAGE_NAMES


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
    """Every case of ``job`` benchmarked here; ``wrap`` sees the cases as they finish (a progress bar). A case
    whose new kernels fault or hang is refused, not timed: its verdict is the screening's."""
    factory = backend_named(job.backend)
    faulted = _faulting(job, factory)
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
        benches = list(wrap(CaseBench(case, faulted[case], None) if case in faulted
                            else bench_case(golden, case, subjects, job.options, job.recorded, peaks)
                            for case in job.cases))
    for subject in subjects:
        subject.close()
    return DeviceRun(benches, subjects[0].timer_name, peaks_cache.get("peaks", (None, None)),
                     subjects[0].runner.provenance, subjects[0].persisting_l2, subjects[0].timer_fallback)


def _faulting(job: BenchJob, factory) -> dict[str, CaseVerdict]:
    """The cases whose new kernels fault or hang, found by a conformance run in a worker process before this
    one launches anything: bench times launches in its own process, where a fault would end the run (a signal)
    or its CUDA context. The worker is gone before timing starts."""
    runner = DeviceRunner(KernelDirectory(job.kernels, build=job.profile), backend_factory=factory, isolate=True)
    try:
        with GoldenFile(job.file) as golden:
            reports = (check_case(golden, case, runner, STAGE_NAMES) for case in job.cases)
            return {report.case: report for report in reports if report.fault is not None}
    finally:
        runner.worker.stop()
