"""The one result model of every check: case -> step -> stage -> the tensors that diverged, typed findings.

An oracle replay (verify, bridge) judges every step and keeps each failing
step's tensors. A device replay (check_case) also gives every stage a
verdict, which keeps the stage's first divergent step and its failing
tensors: chained, what a stage computes after that reads what it wrote. The
first divergence of a stream (bisect, reduce, fuzz) is one ``StepVerdict``.
``CaseVerdict.entry`` is the case as the results document records it
(csa_conform.check.results), whichever replay made it, so there is one way
to say that a step or stage of a case diverged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

from csa_conform._base.statuses import DIVERGED, FAULT, HANG, NOT_COMPARED
from csa_conform._base.terminal import escaped, one_line
from csa_conform.check.findings import RunFinding
from csa_conform.check.results import (
    CORRUPT_DATASET,
    INVALID_CASE,
    STEP_REJECTED,
    CaseEntry,
    Failure,
    StageEntry,
    StepEntry,
)
from csa_conform.compare.bitwise import TensorDiff


@dataclass
class StageVerdict:
    """A stage of a device replay: its status and, when it diverged, its first divergent step, the kernel that
    wrote it, its failing tensors and their structural findings (csa_conform.explain.patterns)."""

    stage: str
    placement: str
    status: str = NOT_COMPARED
    step: int | None = None
    message: str | None = None
    diffs: list[TensorDiff] = field(default_factory=list)
    kernel: str | None = None  # 'module.cu:entry' that wrote the stage (None on the host)
    diagnosis: list = field(default_factory=list)


@dataclass
class StepVerdict:
    """One step: passed, or why not: a problem line of type ``problem_type`` and/or the diverging tensors.

    ``stage`` is the stage a device run stopped at (a refused step) or, for a stream's first divergence, its
    earliest divergent stage, whose tensors ``diffs`` are; ``diverged_stages`` are all of that step's.
    """

    step: int
    passed: bool = True
    compared: bool = False
    expect_error: str | None = None
    problem: str | None = None
    problem_type: str = STEP_REJECTED
    diffs: list[TensorDiff] = field(default_factory=list)
    stage: str | None = None
    diverged_stages: tuple[str, ...] = ()

    @property
    def tensor(self) -> str | None:
        """The first diverging tensor (None for a problem)."""
        return self.diffs[0].tensor if self.diffs else None

    @property
    def element(self) -> dict | None:
        """The first diverging element of the first diverging tensor."""
        return self.diffs[0].first if self.diffs else None


@dataclass
class CaseVerdict:
    """One case of any check: its steps, each stage's verdict (device replays), what the depth modes found.

    ``problem`` is a corrupt dataset, ``invalid`` why the case cannot be judged at all; ``errors`` the error
    statistics of ``diff --tolerance`` (csa_conform.compare.errorstats.Gap).
    """

    case: str
    reproduce: str = ""
    family: str = ""
    ratio: int = 0
    step_count: int = 0
    steps: list[StepVerdict] = field(default_factory=list)
    stages: dict[str, StageVerdict] = field(default_factory=dict)
    findings: list[RunFinding] = field(default_factory=list)  # --repeat, --replay and --invariance
    problem: str | None = None
    invalid: str | None = None
    errors: object = None
    time_s: float = 0.0

    @property
    def passed(self) -> bool:
        return (self.invalid is None and self.problem is None and not self.findings
                and all(step.passed for step in self.steps) and not self.diverged() and self.fault is None)

    def diverged(self) -> list[StageVerdict]:
        return [verdict for verdict in self.stages.values() if verdict.status == DIVERGED]

    @property
    def fault(self) -> StepVerdict | None:
        """The step whose launch faulted or hung (its ``problem_type`` says which), where the case ended."""
        return next((step for step in self.steps if step.problem_type in (FAULT, HANG)), None)

    @property
    def stopped(self) -> StepVerdict | None:
        """The step a device run refused, where it stopped (``stage`` says at which stage)."""
        return next((step for step in self.steps if step.problem is not None and step.stage is not None), None)

    @property
    def compared_steps(self) -> int:
        return sum(1 for step in self.steps if step.compared)

    @property
    def rejected_steps(self) -> list[int]:
        """The steps the golden file stores as rejected."""
        return [step.step for step in self.steps if step.expect_error is not None]

    def failure_lines(self) -> list[str]:
        """One line per failure, each ending with the command that reproduces the case (controls escaped)."""
        case, lines = escaped(self.case), []
        if self.invalid:
            lines.append(f"INVALID {case}: {self.invalid}")
        if self.problem:
            lines.append(f"FAIL {case}: {self.problem}")
        for step in self.steps:
            if step.problem:
                lines.append(f"FAIL {case} step {step.step}: {step.problem}")
            lines += [f"FAIL {case} step {step.step} {diff.summary()}" for diff in step.diffs]
        return [one_line(f"{line} — reproduce: {self.reproduce}") for line in lines]

    def entry(self, reproduce: Callable[[str], str] | None = None,
              reproduce_fault: Callable[[str], str] | None = None) -> CaseEntry:
        """The case's node of the results document; ``reproduce(stage)`` is the command of one stage (a device
        replay's), else ``self.reproduce`` reproduces everything; ``reproduce_fault(stage)`` that of a launch that
        faulted (under a memory checker), else ``reproduce``."""
        command = reproduce or (lambda stage: self.reproduce)
        failure = (Failure(INVALID_CASE, self.invalid, command("all")) if self.invalid else
                   Failure(CORRUPT_DATASET, self.problem, command("all")) if self.problem else None)
        return CaseEntry(
            self.case,
            passed=self.passed,
            family=self.family,
            time_s=self.time_s,
            reproduce=command("all"),
            steps_total=self.step_count,
            steps_compared=self.compared_steps,
            rejected_steps=self.rejected_steps,
            verdicts={stage: verdict.status for stage, verdict in self.stages.items()} if self.stages else None,
            failure=failure,
            steps=self._stage_steps(command, reproduce_fault or command) if self.stages else self._failing_steps(),
        )

    def _failing_steps(self) -> list[StepEntry]:
        """An oracle replay's failing steps, each with its tensors by stage."""
        return [StepEntry(step.step,
                          failure=Failure(step.problem_type, step.problem, self.reproduce) if step.problem else None,
                          stages=_by_stage(step.diffs, self.reproduce))
                for step in self.steps if not step.passed]

    def _stage_steps(self, reproduce: Callable[[str], str], reproduce_fault: Callable[[str], str]) -> list[StepEntry]:
        """A device replay's steps that say something: where it stopped, what a depth mode found, and the first
        divergent step of each stage with that stage's tensors."""
        steps: dict[int, StepEntry] = {}
        stopped = self.stopped
        if stopped is not None:
            stage = stopped.stage if stopped.stage in self.stages else "all"
            faulted = stopped.problem_type in (FAULT, HANG)
            steps[stopped.step] = StepEntry(stopped.step, failure=Failure(
                stopped.problem_type if faulted else STEP_REJECTED, stopped.problem,
                (reproduce_fault if faulted else reproduce)(stage),
                {"stage": stopped.stage, **({"kernel": self.stages[stage].kernel} if faulted and stage in self.stages
                                             else {})}))
        for finding in self.findings:
            steps.setdefault(finding.step, StepEntry(finding.step)).findings.append(
                finding.failure(reproduce(finding.stages[0])))
        for verdict in self.diverged():
            if verdict.diffs:
                steps.setdefault(verdict.step, StepEntry(verdict.step)).stages.append(StageEntry(
                    verdict.stage, reproduce(verdict.stage), verdict.diffs, verdict.kernel, verdict.diagnosis))
        return [steps[index] for index in sorted(steps)]


def _by_stage(diffs: Iterable[TensorDiff], reproduce: str) -> list[StageEntry]:
    stages: dict[str, list[TensorDiff]] = {}
    for diff in diffs:
        stages.setdefault(diff.stage, []).append(diff)
    return [StageEntry(stage, reproduce, found) for stage, found in stages.items()]
