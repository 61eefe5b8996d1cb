"""Judging mutants: each one through the ordinary gate (a chained diff of the golden cases), in reused workers.

A worker process opens the golden file once, keeps its backend (the host
backend's shared build folder, CUDA's compiled-module cache) and judges mutant
after mutant in process: the mutated directory differs from the original in
one file, so only the modules built from that file compile again. Cases run
in the order the parent sends, those that killed most mutants so far first,
and judging stops at the first case that fails (killed); a survivor runs
every case. The parent supervises: a worker that dies (a mutant that
segfaults the host backend), one that reports a dead CUDA context (a launch
that faulted) and one past ``timeout_s`` (a mutant that loops) is replaced,
its mutant judged ``fault`` or ``hang``, and the next mutant goes on.
``classify`` is the one place an outcome becomes a verdict.
"""

from __future__ import annotations

import multiprocessing
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from csa_conform.check.conformance import check_case
from csa_conform.check.model import CaseVerdict
from csa_conform.check.options import BuildChoice
from csa_conform.device.backend import HOST, backend_named
from csa_conform.device.devices import own_device
from csa_conform.device.kernels import MANIFEST, KernelDirectory
from csa_conform.device.runner import DeviceRunner
from csa_conform.errors import DeviceUnavailable
from csa_conform.golden import GoldenFile, GoldenStep
from csa_conform.mutate.mutants import Mutant, directory_files
from csa_conform.spec import Mode

KILLED, SURVIVED, BUILD_FAILED, FAULT, HANG = "killed", "survived", "did-not-build", "fault", "hang"
VERDICTS = (KILLED, SURVIVED, BUILD_FAILED, FAULT, HANG)
# The messages by which the backends refuse a module that does not build (csa_conform.device.cuda, .host).
BUILD_MESSAGES = ("cannot build", "cannot compile", "cannot load the PTX", "is not a block size", "has no entry")


@dataclass(frozen=True)
class Verdict:
    """What judging one mutant found: the verdict, and for a kill the first failing case, stage, step and
    tensor (a fault or hang: what happened, in ``detail``)."""

    verdict: str
    case: str | None = None
    stage: str | None = None
    step: int | None = None
    tensor: str | None = None
    detail: str = ""
    time_s: float = 0.0
    cases_run: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "case": self.case, "stage": self.stage, "step": self.step,
                "tensor": self.tensor, "detail": self.detail, "time_s": round(self.time_s, 3),
                "cases_run": self.cases_run}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Verdict:
        return cls(data["verdict"], data.get("case"), data.get("stage"), data.get("step"), data.get("tensor"),
                   data.get("detail", ""), data.get("time_s", 0.0), data.get("cases_run", 0))


def classify(case: str | None = None, report: CaseVerdict | None = None, error: BaseException | None = None,
             exit_code: int | None = None, timed_out: bool = False) -> Verdict:
    """The verdict of one outcome: a case's report (killed when it failed, its first failing stage named),
    an exception judging it (a module that does not build, a launch that faulted), a worker that died
    (``exit_code``, negative for a signal) or one stopped at the timeout. A fault or hang kills."""
    if timed_out:
        return Verdict(HANG, case, detail="still running at the timeout; the worker was killed")
    if exit_code is not None:
        how = (f"killed by {signal.Signals(-exit_code).name}" if exit_code < 0 and -exit_code in
               signal.valid_signals() else f"exit code {exit_code}")
        return Verdict(FAULT, case, detail=f"the worker judging it died ({how})")
    if error is not None:
        message = " ".join(str(error).split())
        if isinstance(error, DeviceUnavailable) and any(text in message for text in BUILD_MESSAGES):
            return Verdict(BUILD_FAILED, detail=message)
        if isinstance(error, DeviceUnavailable):
            return Verdict(FAULT, case, detail=message)
        return Verdict(FAULT, case, detail=f"the run raised {type(error).__name__}: {message}")
    assert report is not None
    for stage in report.stages.values():  # a diff that judges a faulted or endless launch as the case's verdict
        if stage.status in (FAULT, HANG):
            return Verdict(stage.status, case, stage.stage, stage.step, None, stage.message or "")
    if report.passed:
        return Verdict(SURVIVED)
    diverged = report.diverged()
    if diverged:
        first = min(diverged, key=lambda verdict: (verdict.step if verdict.step is not None else 1 << 30))
        tensor = first.diffs[0].tensor if first.diffs else None
        return Verdict(KILLED, case, first.stage, first.step, tensor, first.message or "")
    stopped = report.stopped
    if stopped is not None:
        return Verdict(KILLED, case, stopped.stage, stopped.step, None, stopped.problem or "")
    if report.findings:
        finding = report.findings[0]
        return Verdict(KILLED, case, finding.stages[0] if finding.stages else None, finding.step, None,
                       f"{finding.kind}: {finding.message}")
    return Verdict(KILLED, case, detail=report.invalid or report.problem or "failed")


class MutantDirectory(KernelDirectory):
    """A kernel directory with one file's text replaced: the original's path, manifest and build, so every
    other module's source (and its compiled cache entry) is the original's."""

    def __init__(self, base: KernelDirectory, name: str, text: str):
        self.__dict__.update(base.__dict__)
        self.mutated = {name: text}

    def _read(self, name: str) -> str:
        if name in self.mutated:
            return self.mutated[name]
        return super()._read(name)


@dataclass(frozen=True)
class Setup:
    """Everything a worker needs to judge mutants (sent to it once, so it pickles)."""

    golden: str
    build: BuildChoice
    backend: str
    ulp: int
    repeat: int
    stages: tuple[str, ...]
    build_dir: str | None  # the host backend's build folder, shared by the workers
    sanitize: str | None = None
    case_glob: str | None = None  # the cases, as --case selected them (for the sanitized child's diff)


@dataclass(frozen=True)
class Task:
    mutant: Mutant | None  # None: the unmutated directory (the baseline)
    text: str
    order: tuple[str, ...]  # the cases, in the order to run them


@dataclass
class Judged:
    """A worker's answer: the verdict, each case's seconds (the baseline's), and whether the worker must go
    (a CUDA context a faulting launch left unusable, however the fault was reported)."""

    verdict: Verdict
    case_times: dict[str, float] = field(default_factory=dict)
    retire: bool = False


# The golden bytes a worker keeps (the ci suite's steps are 285 MB unpacked; a prod suite's are read each time).
KEPT_BYTES = 384 << 20


class KeptGoldens:
    """A golden file whose steps are read (and their digests checked) once per worker, then kept, up to
    KEPT_BYTES: every mutant replays the same steps, and reading them all again costs a survivor about 2 s
    of the ci suite. The kept arrays are read-only, so no replay can change what the next one reads."""

    def __init__(self, path: str):
        self.file = GoldenFile(path)
        self.steps: dict[tuple[str, int], GoldenStep] = {}
        self.kept = 0

    def read_step(self, case_id: str, index: int) -> GoldenStep:
        key = (case_id, index)
        if key in self.steps:
            return self.steps[key]
        step = self.file.read_step(case_id, index)
        arrays = [array for group in (step.inputs, step.outputs, *step.stages.values()) for array in group.values()]
        size = sum(array.nbytes for array in arrays)
        if self.kept + size <= KEPT_BYTES:
            for array in arrays:
                array.flags.writeable = False
            self.steps[key] = step
            self.kept += size
        return step

    def __getattr__(self, name: str) -> Any:
        return getattr(self.file, name)


class Judge:
    """Judges tasks in one process: the golden file's steps kept, one backend for every mutant."""

    def __init__(self, setup: Setup):
        self.setup = setup
        self.base = setup.build.directory()
        self.golden = KeptGoldens(setup.golden)
        if setup.backend == HOST:  # in the run's build folder, which every worker shares
            from csa_conform.device.host import HostEmulationBackend

            self._backend = HostEmulationBackend(Path(setup.build_dir) if setup.build_dir else None)
        else:
            self._backend = backend_named(setup.backend)()
            try:  # the context now, so a GPU this process cannot use is the run's error, not every mutant's fault
                self._backend.upload(np.zeros(1, np.float32))
            except Exception as error:
                raise DeviceUnavailable(f"a mutate worker cannot use the GPU ({' '.join(str(error).split())}); "
                                        "in an exclusive compute mode only --jobs 1 can") from None

    def judge(self, task: Task) -> Judged:
        """The plain gate first; a survivor again with ``--repeat`` and then under the sanitizer, where asked.
        A mutant the plain gate kills is killed by the deeper ones too (their first run is the plain run), so
        only survivors pay for them."""
        started = time.perf_counter()
        kernels = self.base if task.mutant is None else MutantDirectory(self.base, task.mutant.file, task.text)
        times: dict[str, float] = {}
        repeats = (1, self.setup.repeat) if task.mutant is not None and self.setup.repeat > 1 else (self.setup.repeat,)
        cases = 0
        for repeat in repeats:
            runner = DeviceRunner(kernels, mode=Mode.CHAINED, backend_factory=lambda: self._backend, repeat=repeat)
            for case in task.order:
                cases += 1
                case_started = time.perf_counter()
                try:
                    report = check_case(self.golden, case, runner, self.setup.stages, self.setup.ulp)
                except Exception as error:  # a build failure or a faulted launch is the mutant's verdict
                    verdict = classify(case, error=error)
                    retire = verdict.verdict == FAULT and self.setup.backend != HOST
                    return Judged(_timed(verdict, started, cases), times, retire)
                if repeat == repeats[0]:
                    times[case] = time.perf_counter() - case_started
                verdict = classify(case, report)
                if verdict.verdict != SURVIVED:
                    retire = verdict.verdict == FAULT and self.setup.backend != HOST
                    return Judged(_timed(verdict, started, cases), times, retire)
        verdict = Verdict(SURVIVED)
        if self.setup.sanitize and task.mutant is not None:
            verdict = self._sanitized(task) or verdict
        return Judged(_timed(verdict, started, cases), times)

    def _sanitized(self, task: Task) -> Verdict | None:
        """A survivor run again under compute-sanitizer (the whole diff, in a child): killed when the tool
        reports an error."""
        from csa_conform.device.sanitizer import run_sanitized

        with tempfile.TemporaryDirectory(prefix="csa-mutant-") as work:
            directory = Path(work) / "kernels"
            write_directory(self.base, task.mutant, task.text, directory)
            build = BuildChoice(kernels=str(directory), name=self.base.build.name,
                                nvrtc_options=self.setup.build.nvrtc_options, strict_ptx=self.setup.build.strict_ptx)
            words = [self.setup.golden, "--stage", ",".join(self.setup.stages), *build.words(),
                     "--ulp", str(self.setup.ulp), "--repeat", str(self.setup.repeat)]
            words += ["--case", self.setup.case_glob] if self.setup.case_glob else []
            run = run_sanitized(self.setup.sanitize, words)
        if run.findings or run.error_count:
            first = run.findings[0] if run.findings else None
            return Verdict(KILLED, None, "sanitizer", None, first.kind if first else None,
                           first.summary() if first else f"{run.error_count} errors ({self.setup.sanitize})")
        return None


def _timed(verdict: Verdict, started: float, cases_run: int) -> Verdict:
    return Verdict(verdict.verdict, verdict.case, verdict.stage, verdict.step, verdict.tensor, verdict.detail,
                   time.perf_counter() - started, cases_run)


def _elapsed(verdict: Verdict, started: float) -> Verdict:
    """A verdict the parent gave (the worker died or hung), timed from when its task was sent."""
    return Verdict(verdict.verdict, verdict.case, detail=verdict.detail, time_s=time.monotonic() - started)


def write_directory(base: KernelDirectory, mutant: Mutant | None, text: str, target: Path) -> None:
    """A mutant as a kernel directory of its own (the original's files, the manifest, the mutated file)."""
    target.mkdir(parents=True, exist_ok=True)
    for name in [*directory_files(base), MANIFEST]:
        if (base.path / name).is_file():
            shutil.copyfile(base.path / name, target / name)
    if mutant is not None:
        (target / mutant.file).write_text(text, encoding="utf-8")


@dataclass(frozen=True)
class Unavailable:
    """A worker's answer when it cannot judge at all (its backend would not start)."""

    message: str


def _serve(connection: Connection, setup: Setup, visible: str | None) -> None:
    """A worker's loop (on the GPU ``visible`` names, when given): judge each task received, answer, stop at
    None or when retired."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent answers Ctrl-C and stops the workers
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if visible is not None:
        own_device(visible)
    try:
        judge = Judge(setup)
    except DeviceUnavailable as error:  # no device, no g++: the run's environment, not a mutant's verdict
        connection.recv()
        connection.send(Unavailable(str(error)))
        return
    while True:
        task = connection.recv()
        if task is None:
            return
        judged = judge.judge(task)
        connection.send(judged)
        if judged.retire:
            return


@dataclass
class _Slot:
    process: multiprocessing.Process
    connection: Connection
    device: str | None
    task: Task | None = None
    key: Any = None
    started: float = 0.0
    deadline: float = 0.0
    served: int = 0  # tasks this worker answered before the current one
    confirming: bool = False  # the current task died in an older worker and is judged again here


class Workers:
    """``jobs`` judging processes, each replaced when it dies, retires or runs past the timeout; with
    ``devices`` (CUDA_VISIBLE_DEVICES entries) each new worker takes the GPU fewest workers use.

    A worker that dies after judging other mutants may have died of what an earlier one did to its memory
    (a write past a buffer's guard on the host backend): its task is judged again in a fresh worker, and
    only a second death there is the mutant's fault."""

    def __init__(self, setup: Setup, jobs: int, devices: Sequence[str] = ()):
        self.setup, self.jobs, self.devices = setup, jobs, tuple(devices)
        self.context = multiprocessing.get_context("fork")
        self.slots: list[_Slot] = []
        self.started = 0
        self.again: list[tuple[Any, Task]] = []  # tasks whose used worker died, to judge in a fresh one

    def _start(self) -> _Slot:
        device = None
        if self.devices:
            users = {device: 0 for device in self.devices}
            for slot in self.slots:
                users[slot.device] += 1
            device = min(self.devices, key=lambda name: users[name])
        parent, child = self.context.Pipe()
        process = self.context.Process(target=_serve, args=(child, self.setup, device), daemon=True)
        process.start()
        child.close()
        self.started += 1
        return _Slot(process, parent, device)

    def run(self, tasks: Iterator[tuple[Any, Task]], timeout_s: float) -> Iterator[tuple[Any, Judged]]:
        """Each (key, task) judged, answers as they come: (key, Judged)."""
        pending = iter(tasks)
        exhausted = False
        while True:
            while (self.again or not exhausted) and len([slot for slot in self.slots if slot.task is not None]) < self.jobs:
                confirming = bool(self.again)
                item = self.again.pop(0) if confirming else next(pending, None)
                if item is None:
                    exhausted = True
                    break
                slot = next((slot for slot in self.slots if slot.task is None), None)
                if slot is not None and confirming:
                    self._replace(slot)  # a fresh process for the task a used one died on, within --jobs
                    slot = None
                if slot is None:
                    slot = self._start()
                    self.slots.append(slot)
                slot.confirming = confirming
                slot.key, slot.task = item
                slot.started = time.monotonic()
                slot.deadline = slot.started + timeout_s
                slot.connection.send(slot.task)
            busy = [slot for slot in self.slots if slot.task is not None]
            if not busy:
                if self.again:
                    continue
                return
            left = max(0.0, min(slot.deadline for slot in busy) - time.monotonic())
            ready = wait([slot.connection for slot in busy], timeout=left)
            for slot in busy:
                if slot.connection in ready:
                    key, task = slot.key, slot.task
                    judged = self._answer(slot)
                    if judged is None:
                        self.again.append((key, task))
                    else:
                        yield key, judged
                elif time.monotonic() >= slot.deadline:
                    self._replace(slot)
                    yield slot.key, Judged(_elapsed(classify(timed_out=True), slot.started))

    def _answer(self, slot: _Slot) -> Judged | None:
        """The worker's answer; None when it died having judged others first (its task is judged again)."""
        try:
            judged = slot.connection.recv()
        except (EOFError, OSError):
            slot.process.join(5)
            code = slot.process.exitcode if slot.process.exitcode is not None else -signal.SIGKILL
            self._replace(slot)
            if slot.served and not slot.confirming:
                return None
            return Judged(_elapsed(classify(exit_code=code), slot.started))
        slot.served += 1
        if isinstance(judged, Unavailable):
            self._replace(slot)
            raise DeviceUnavailable(judged.message)
        if judged.retire:
            slot.process.join(5)
            self._replace(slot)
        slot.task = None
        return judged

    def _replace(self, slot: _Slot) -> None:
        """The slot's process ended (killed here if it still runs); a new one is started when next needed."""
        if slot.process.is_alive():
            slot.process.kill()
        slot.process.join(5)
        slot.connection.close()
        self.slots.remove(slot)

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        for slot in list(self.slots):
            try:
                slot.connection.send(None)
            except (OSError, ValueError):
                pass
        for slot in list(self.slots):
            slot.process.join(2)
            if slot.process.is_alive():
                slot.process.kill()
                slot.process.join(2)
        self.slots.clear()


def ordered_cases(cases: Sequence[str], kills: dict[str, int], times: dict[str, float]) -> tuple[str, ...]:
    """The cases that killed most mutants so far first, then the quickest (the baseline's times)."""
    return tuple(sorted(cases, key=lambda case: (-kills.get(case, 0), times.get(case, 0.0), case)))

