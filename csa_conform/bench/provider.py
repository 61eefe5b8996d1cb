"""``bench --kernels python:…``: a Python provider's calls timed one by one, and its step, once they pass.

Each case is replayed through the conformance check first (chained, every
stage the provider computes on it); the calls of the last step it ran are
then repeated with the very arguments the check gave them, a call only when
every stage it computes is identical to the oracle (with ``--time-diverged``
any call, marked untrusted). On the CPU a sample is
host wall time (``time.perf_counter``) and every time says so; on the GPU
it is CUDA events recorded on the legacy default stream around the call (a
provider that works on other streams joins them before it returns, as the
protocol asks). Nothing is flushed between samples, and a call is not
re-poisoned: a provider owns its buffers. The last repetition's payloads
must be the conformance run's bit for bit, else the row is ``refused``.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from csa_conform._base.statuses import IDENTICAL
from csa_conform.bench.measure import NOT_TIMED, REFUSED, STEP_ROW, TIMED, UNTRUSTED, BenchOptions, CaseBench, Row
from csa_conform.bench.run import DeviceRun
from csa_conform.bench.samples import Reading, collect
from csa_conform.bench.timers import HOST_CAVEAT
from csa_conform.check.conformance import check_case
from csa_conform.check.model import CaseVerdict
from csa_conform.check.options import BuildChoice, RunOptions
from csa_conform.device.provider import Provider, RecordedCall, adopt
from csa_conform.golden import GoldenFile
from csa_conform.numerics.bits import same_bits
from csa_conform.spec import STAGE_NAMES, Mode

HOST_TIMER = "host-perf-counter"
EVENTS_TIMER = "cuda-events"
GPU_CAVEAT = "a python: provider's calls, CUDA events on the legacy default stream; no L2 flush between samples"


def caveat(device: str) -> str:
    """What every time of a provider on ``device`` says about itself."""
    return GPU_CAVEAT if device.startswith("cuda") else f"{HOST_CAVEAT} (a python: provider on the CPU)"


def _clock(provider: Provider) -> Callable[[Callable[[], object]], Reading]:
    """How one repetition of a call (or of the step's calls) is timed on the provider's device."""
    if not provider.gpu:
        def host(work: Callable[[], object]) -> Reading:
            started = time.perf_counter()
            work()
            return Reading(time.perf_counter() - started)
        return host
    import cupy

    def events(work: Callable[[], object]) -> Reading:
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        cupy.cuda.Device().synchronize()
        start.record(cupy.cuda.Stream.null)
        work()
        end.record(cupy.cuda.Stream.null)
        end.synchronize()
        return Reading(cupy.cuda.get_elapsed_time(start, end) / 1e3)
    return events


def _same_payloads(provider: Provider, recorded: RecordedCall, returned) -> bool:
    for stage, tensors in recorded.payloads.items():
        for tensor, value in tensors.items():
            again = provider.transfer.download(adopt(returned[tensor], tensor))
            if not same_bits(provider.transfer.download(value), np.asarray(again)):
                return False
    return True


def _row(provider: Provider, name: str, stages: tuple[str, ...], calls: list[RecordedCall], report: CaseVerdict,
         options: BenchOptions) -> Row:
    trusted = all(report.stages[stage].status == IDENTICAL for stage in stages if stage in report.stages)
    if not trusted and not options.time_diverged:
        return Row(name, stages, NOT_TIMED, "a stage it computes diverged from the oracle")
    clock = _clock(provider)
    last: list = []

    def work() -> None:
        last[:] = [recorded.again() for recorded in calls]

    samples = collect([lambda: clock(work)], options.policy, None)[0]
    if not all(_same_payloads(provider, recorded, returned) for recorded, returned in zip(calls, last)):
        return Row(name, stages, REFUSED, "a timed repetition returned other payloads than the conformance run",
                   repetitions=samples.repetitions(1))
    return Row(name, stages, TIMED if trusted else UNTRUSTED, None if trusted else "timed although a stage it "
               "computes diverged from the oracle (--time-diverged)", samples=samples, repetitions=samples.repetitions(1))


def run_provider(file: str, cases: tuple[str, ...], kernels: str, options: BenchOptions,
                 wrap: Callable = list) -> DeviceRun:
    """Every case's rows: each provider call of its last step, then the step's calls together."""
    runner = RunOptions(file=file, mode=Mode.CHAINED, force_host=frozenset(), ulp=0,
                        build=BuildChoice(kernels=kernels)).runner()
    provider = runner.provider
    provider.recording = True

    def bench(golden: GoldenFile, case: str) -> CaseBench:
        started = time.perf_counter()
        report = check_case(golden, case, runner, STAGE_NAMES)
        report.time_s = time.perf_counter() - started
        calls = [recorded for recorded in provider.recorded if recorded.case == case]
        provider.recorded = []
        result = CaseBench(case, report, calls[-1].step if calls else None)
        if report.stopped is not None or not calls:
            return result
        for recorded in calls:
            result.rows.append(_row(provider, f"{provider.name}.{recorded.call.module}", recorded.call.stages,
                                    [recorded], report, options))
        stages = tuple(dict.fromkeys(stage for recorded in calls for stage in recorded.call.stages))
        result.rows.append(_row(provider, STEP_ROW, stages, calls, report, options))
        return result

    with GoldenFile(file) as golden:
        benches = list(wrap(bench(golden, case) for case in cases))
    return DeviceRun(benches, EVENTS_TIMER if provider.gpu else HOST_TIMER, (None, None), runner.provenance)
