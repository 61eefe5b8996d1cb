"""A device run over a golden file's cases: each case replayed through the runner and judged stage by
stage, with the invariance variants and error statistics the options ask for, on one GPU or spread over
several. What ``diff`` runs and renders, and what the bisect, explain and plugin front ends build on."""

from __future__ import annotations

import functools
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable, Sequence

from csa_conform._base.case_glob import matching_cases
from csa_conform._base.shards import Shard
from csa_conform._base.statuses import IDENTICAL, NOT_COMPARED
from csa_conform.check.conformance import Diagnose, check_case
from csa_conform.check.invariance import check_invariance
from csa_conform.check.model import CaseVerdict
from csa_conform.check.options import RunOptions
from csa_conform.check.results import golden_reference
from csa_conform.device.devices import resolve_devices, spread
from csa_conform.device.runner import DeviceRunner
from csa_conform.golden import GoldenFile

# (the timed verdicts as they come, how many, a label, a one-line description of one) -> the same verdicts
Watch = Callable[[Iterable, int, str, Callable], Iterable]


def _timed(golden: GoldenFile, case: str, runner: DeviceRunner, stages: tuple[str, ...], ulp: int,
           measure: bool = False, invariance: tuple[str, ...] = (), diagnose: Diagnose | None = None,
           ) -> CaseVerdict:
    started = time.perf_counter()
    report = check_case(golden, case, runner, stages, ulp, measure, diagnose=diagnose)
    if invariance:
        with tempfile.TemporaryDirectory(prefix="csa-invariance-") as work:
            found, _ = check_invariance(golden, case, runner, invariance, Path(work))
        report.findings.extend(found)
        for finding in found:
            verdict = report.stages.get(finding.stages[0])
            if verdict is not None and verdict.status in (IDENTICAL, NOT_COMPARED):
                verdict.status, verdict.step = finding.kind, finding.step
    report.time_s = time.perf_counter() - started
    return report


def check_cases(options: RunOptions, stages: tuple[str, ...], diagnose: Diagnose | None, cases: Sequence[str]):
    """The timed verdicts of ``cases`` and the run's provenance: one process, one device (a --devices worker)."""
    runner = options.runner()
    with GoldenFile(options.file) as golden:
        return [_timed(golden, case, runner, stages, options.ulp, options.tolerance is not None, options.invariance,
                       diagnose) for case in cases], runner.provenance


def run_cases(options: RunOptions, golden: GoldenFile, stages: tuple[str, ...], case_glob: str | None,
              shard: Shard | None = None, devices: tuple[int, ...] | None | bool = False, watch: Watch | None = None,
              diagnose: Diagnose | None = None):
    """The timed verdicts of every selected case (of this shard) of ``golden`` (options.file, open: the caller's
    explanations re-read its failing cases from the same index), the run's provenance, and the golden file's
    reference; ``devices`` (ordinals, or None for all) spreads the cases over GPUs, each worker opening the file
    itself; ``watch`` (the CLI's progress bar) sees each case as it is judged; ``diagnose`` is check_case's."""
    # A provider is loaded in each --devices worker only: its import may start CUDA, which a fork must not inherit.
    runner = None if options.build.provider and devices is not False else options.runner()
    cases = matching_cases(golden.case_ids(), case_glob, golden.path)
    golden_ref = golden_reference(options.file, golden.schema_version)
    if shard is not None:
        cases = shard.select(cases)
    if devices is not False:
        reports, provenance = spread(resolve_devices(devices), functools.partial(check_cases, options, stages, diagnose),
                                     cases)
        return reports, provenance, golden_ref

    assert runner is not None

    def describe(done: CaseVerdict) -> str:
        return f"{'ok  ' if done.passed else 'DIFF'} {done.case}"

    timed = (_timed(golden, case, runner, stages, options.ulp, options.tolerance is not None, options.invariance,
                    diagnose) for case in cases)
    reports = list(watch(timed, len(cases), "diff", describe) if watch else timed)
    return reports, runner.provenance, golden_ref


