"""One case benchmarked: conformance first, then every trusted launch and the whole step timed.

Each kernel directory (the new one, and with ``--baseline-kernels`` the
baseline) replays the case through the conformance check
(csa_conform.check.conformance.check_case) on a RecordingRunner; the last
step it ran is then timed on the very buffers the check accepted. A launch
is timed only when every stage it computes came out identical to the oracle
(``time_diverged`` times it anyway, marked untrusted). Each row is probed
once and checked again after its last sample (csa_conform.bench.trust): a
launch whose outputs then differ from the conformance run's is refused and
its times dropped. The probe is also the first warm-up repetition
(csa_conform.bench.samples), and every row counts the repetitions it spent. Rows are the launches alone (``cold``: L2 flushed and the
persisting L2 reset before every sample; ``hot``: not, the inputs rotated
instead, csa_conform.bench.rotation) and the whole step (one CUDA graph); ``step``
mode times the step only. With a baseline the two directories' samples are
taken interleaved and the gate (csa_conform.bench.gate) judges every row
(the baseline's conformance check reads the case as the new kernels' did,
not again from the file);
a SLOW row is measured again before it stands.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from csa_conform._base.statuses import IDENTICAL
from csa_conform.bench.gate import SLOW, Judgement, compare, confirm
from csa_conform.bench.recording import RecordingRunner, StepLaunches
from csa_conform.bench.roofline import Work, launch_work, roofline
from csa_conform.bench.rotation import Rotation, cycled, rotated
from csa_conform.bench.samples import Policy, Repetitions, Samples, Timed, collect, timed
from csa_conform.bench.timers import AUTO, timer_for
from csa_conform.bench.trust import Guard
from csa_conform.check.conformance import check_case
from csa_conform.check.model import CaseVerdict
from csa_conform.device.backend import Backend
from csa_conform.device.kernels import MODULES, KernelDirectory
from csa_conform.device.recorder import RecordedLaunch
from csa_conform.golden import GoldenFile, GoldenStep
from csa_conform.spec import STAGE_NAMES

COLD, HOT, STEP = "cold", "hot", "step"
MODES = (COLD, HOT, STEP)
STEP_ROW = "step"

# Row statuses.
TIMED = "timed"
UNTRUSTED = "untrusted"  # timed although a stage it computes diverged (--time-diverged)
NOT_TIMED = "not-timed"  # a stage it computes diverged
REFUSED = "refused"  # a timed repetition left other bytes than the conformance run
THROTTLED = "throttled"  # every sample ran below 75% of the maximum SM clock


@dataclass(frozen=True)
class BenchOptions:
    mode: str = COLD
    policy: Policy = Policy()
    time_diverged: bool = False


@dataclass
class Row:
    """One timed row of a case: a launch (named by its module) or the whole step."""

    name: str
    stages: tuple[str, ...]
    status: str
    message: str | None = None
    samples: Samples | None = None
    work: Work | None = None
    roofline: dict | None = None
    baseline: Samples | None = None
    judgement: Judgement | None = None
    rotation: Rotation | None = None  # hot rows: the copies of the inputs their samples cycled through
    repetitions: Repetitions | None = None  # what the new kernels' side launched for it (None: nothing)

    @property
    def timed(self) -> bool:
        return self.status in (TIMED, UNTRUSTED)


@dataclass
class CaseBench:
    case: str
    report: CaseVerdict
    step: int | None
    rows: list[Row] = field(default_factory=list)

    @property
    def conformance_s(self) -> float:
        """The check's wall time: compile, module load and first launches included."""
        return self.report.time_s

    @property
    def refused(self) -> bool:
        return any(row.status == REFUSED for row in self.rows)

    @property
    def passed(self) -> bool:
        return self.report.passed and not self.refused

    def step_vs_sum(self) -> float | None:
        """The whole step's median over the sum of its launches' medians (None unless all were timed)."""
        step = next((row for row in self.rows if row.name == STEP_ROW and row.timed), None)
        launches = [row for row in self.rows if row.name != STEP_ROW]
        if step is None or not launches or not all(row.timed for row in launches):
            return None
        return step.samples.summary().median / sum(row.samples.summary().median for row in launches)


class SharedReads:
    """The golden file with each step of a case read (decompressed, its digests verified) once for all the
    subjects' conformance checks; the arrays are read-only, so no check can change what the next one reads."""

    def __init__(self, golden: GoldenFile):
        self._golden = golden
        self._steps: dict[tuple[str, int], GoldenStep] = {}

    def __getattr__(self, name: str):
        return getattr(self._golden, name)

    def read_step(self, case_id: str, index: int) -> GoldenStep:
        if (case_id, index) not in self._steps:
            step = self._golden.read_step(case_id, index)
            payloads = [step.inputs, step.outputs, *step.stages.values()]
            for array in (array for payload in payloads for array in payload.values()):
                array.flags.writeable = False
            self._steps[case_id, index] = step
        return self._steps[case_id, index]


class Subject:
    """One kernel directory: its recording runner and, once it launched, its timer."""

    def __init__(self, kernels: KernelDirectory, backend_factory: Callable[[], Backend], timer: str = AUTO):
        self.runner = RecordingRunner(kernels, backend_factory)
        self.timer_choice = timer
        self._timer = None

    def check(self, golden: GoldenFile | SharedReads, case: str) -> tuple[CaseVerdict, StepLaunches | None]:
        self.runner.last = None
        started = time.perf_counter()
        report = check_case(golden, case, self.runner, STAGE_NAMES)
        report.time_s = time.perf_counter() - started
        return report, self.runner.last

    @property
    def backend(self):
        return self.runner.recorder.inner

    @property
    def parameters(self) -> dict[str, tuple[str, ...]]:
        """Entry -> parameter names, so a refusal names the argument."""
        kernels = self.runner.kernels
        return {entry: kernels.module(module).parameters for module, entry in MODULES.items()}

    @property
    def timer(self):
        if self._timer is None:
            self._timer = timer_for(self.backend, self.timer_choice)
        return self._timer

    @property
    def timer_name(self) -> str | None:
        """The timer that timed this subject's rows (None when nothing was timed)."""
        return None if self._timer is None else self._timer.name

    @property
    def timer_fallback(self) -> str | None:
        """Why CUPTI did not time this subject's rows where it was wanted (None: it did, or was not wanted)."""
        return None if self._timer is None else self._timer.fallback

    @property
    def persisting_l2(self) -> str | None:
        """How the timer reset the persisting L2 lines before cold samples (None: no device timer)."""
        return None if self._timer is None else self._timer.persisting_l2

    def close(self) -> None:
        if self._timer is not None:
            self._timer.close()


@dataclass
class _Side:
    """A subject's view of one row: its guard, how to issue the row's launches, and their input rotation."""

    subject: Subject
    guard: Guard
    issue: Callable[[], None]
    rotation: Rotation | None = None

    def sample(self, cold: bool):
        return self.subject.timer.sample(self.issue, self.guard, cold)

    def probe(self, cold: bool) -> Timed:
        return timed(lambda: self.sample(cold))

    def mismatch(self) -> str | None:
        return self.guard.mismatch(self.subject.parameters)


def _trusted(report: CaseVerdict, stages: Sequence[str]) -> bool:
    return all(report.stages[stage].status == IDENTICAL for stage in stages if stage in report.stages)


def _rows(step: StepLaunches, mode: str) -> list[tuple[str, tuple[str, ...], list[RecordedLaunch]]]:
    rows = [] if mode == STEP else [(launch.module, launch.stages, [launch]) for launch in step.launches]
    stages = tuple(dict.fromkeys(stage for launch in step.launches for stage in launch.stages))
    return rows + [(STEP_ROW, stages, list(step.launches))]


def _side(subject: Subject, step: StepLaunches, name: str, index: int | None, mode: str) -> _Side:
    """The row's side; hot samples cycle through copies of the inputs (csa_conform.bench.rotation)."""
    launches = step.launches if index is None else [step.launches[index]]
    guard = Guard(subject.backend, step, launches)
    timer = subject.timer
    make = timer.graph if name == STEP_ROW else timer.issue
    if mode != HOT:
        return _Side(subject, guard, make(launches))
    variants, rotation = rotated(subject.backend, launches, timer.cache_bytes)
    return _Side(subject, guard, cycled([make(variant) for variant in variants]), rotation)


def _refusal(sides: list[_Side]) -> str | None:
    """Why the new kernels' row is refused; a baseline side that fails the check is dropped from ``sides``."""
    refused = sides[0].mismatch()
    if refused:
        return refused
    sides[1:] = [side for side in sides[1:] if side.mismatch() is None]
    return None


@dataclass
class _Measured:
    """One measurement of a row: the samples (new first) or why the row is refused, and what the new side spent."""

    samples: list[Samples] | None
    refused: str | None
    repetitions: Repetitions


def _measure(sides: list[_Side], options: BenchOptions) -> _Measured:
    """Probe, sample interleaved (each probe the first warm-up repetition of its side), probe again."""
    cold = options.mode != HOT
    probes = {id(side): side.probe(cold) for side in sides}
    refused = _refusal(sides)
    if refused:
        return _Measured(None, refused, Repetitions(probe=1))
    samples = collect([lambda side=side: side.sample(cold) for side in sides], options.policy,
                      sides[0].subject.timer.max_clock_mhz, probes=[probes[id(side)] for side in sides])
    kept = len(sides)
    refused = _refusal(sides)
    spent = samples[0].repetitions(probe=1)
    if refused:
        return _Measured(None, refused, spent)
    return _Measured(samples[:1] if len(sides) < kept else samples, None, spent)


def _judge(new: Samples, base: Samples, resolution: float) -> Judgement:
    return compare(new.times, base.times, new.cycles(), base.cycles(), resolution)


def _checks(golden: GoldenFile, case: str, subjects: Sequence[Subject]) -> list[tuple[CaseVerdict, StepLaunches | None]]:
    """Every subject's conformance check of the case, its steps read once (and let go once all are checked)."""
    reads = SharedReads(golden) if len(subjects) > 1 else golden
    return [subject.check(reads, case) for subject in subjects]


def bench_case(golden: GoldenFile, case: str, subjects: Sequence[Subject], options: BenchOptions,
               baseline: Mapping[tuple[str, str], Samples] | None = None,
               peaks: Callable[[], tuple[dict | None, dict | None]] = lambda: (None, None)) -> CaseBench:
    """The case's rows for ``subjects[0]``; ``subjects[1]`` (a baseline directory) or ``baseline``
    (samples of an earlier run, by case and row) is what the gate compares each row with."""
    (report, step), *others = _checks(golden, case, subjects)
    bench = CaseBench(case, report, None if step is None else step.step)
    if report.stopped is not None or step is None:
        return bench
    for index, (name, stages, launches) in enumerate(_rows(step, options.mode)):
        trusted = _trusted(report, stages)
        if not trusted and not options.time_diverged:
            bench.rows.append(Row(name, stages, NOT_TIMED, "a stage it computes diverged from the oracle"))
            continue
        launch_index = None if name == STEP_ROW else index
        sides = [_side(subjects[0], step, name, launch_index, options.mode)]
        for (other_report, other_step), subject in zip(others, subjects[1:]):
            if other_step is not None and other_report.stopped is None and _trusted(other_report, stages):
                sides.append(_side(subject, other_step, name, launch_index, options.mode))
        recorded = baseline.get((case, name)) if baseline else None
        row = _timed_row(name, stages, trusted, list(sides), options, step, launches, recorded)
        for side in sides:  # a baseline side the row dropped too: its later rows read these buffers
            side.guard.restore()
        if others and row.timed and row.judgement is None:
            row.message = "the baseline kernels' run of this row diverged or was refused: not compared"
        bench.rows.append(row)
    nominal, measured = peaks()
    for row in bench.rows:
        if row.timed:
            row.roofline = roofline(row.work, row.samples.summary().median, nominal, measured)
    return bench


def _timed_row(name: str, stages: tuple[str, ...], trusted: bool, sides: list[_Side], options: BenchOptions,
               step: StepLaunches, launches: list[RecordedLaunch], recorded: Samples | None) -> Row:
    measured = _measure(sides, options)
    samples, rotation, spent = measured.samples, sides[0].rotation, measured.repetitions
    if samples is None:
        return Row(name, stages, REFUSED, measured.refused, rotation=rotation, repetitions=spent)
    if not samples[0].times:
        return Row(name, stages, THROTTLED, f"all {samples[0].throttled} samples ran throttled", samples[0],
                   rotation=rotation, repetitions=spent)
    work = sum((launch_work(launch, step.geometry) for launch in launches), Work(0, 0))
    row = Row(name, stages, TIMED if trusted else UNTRUSTED,
              None if trusted else "timed although a stage it computes diverged (--time-diverged)", samples[0],
              work, rotation=rotation, repetitions=spent)
    base = samples[1] if len(samples) > 1 else recorded
    if base is None or not base.times:
        return row
    row.baseline = base
    resolution = sides[0].subject.timer.resolution_s
    judgement = _judge(samples[0], base, resolution)
    if judgement.verdict == SLOW:
        again = _measure(sides, options)
        row.repetitions = spent + again.repetitions
        if again.samples is None:
            return Row(name, stages, REFUSED, again.refused, repetitions=row.repetitions)
        judgement = confirm(judgement, _judge(again.samples[0], again.samples[1] if len(again.samples) > 1 else base,
                                              resolution))
    row.judgement = judgement
    return row
