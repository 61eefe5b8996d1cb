"""A golden case replayed on a device runner and compared with the oracle, stage by stage.

The expected side is the golden file's stage payloads (or, for a file that
carries none, the oracle run on the golden inputs). In chained mode a step's
past_* inputs are the previous step's present_* from this run wherever the
golden stream itself threads them (bit-identical golden tensors), so device
state flows through a stream exactly as in production. Steps the oracle
rejects are not run: there is nothing to compare.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from csa_conform._base.statuses import DIVERGED, IDENTICAL, INVALID, NOT_APPLICABLE, NOT_COMPARED
from csa_conform._base.terminal import one_line
from csa_conform.check.findings import RunFinding
from csa_conform.compare.bitwise import TensorDiff, compare_payloads
from csa_conform.compare.errorstats import Gap
from csa_conform.device.launches import RECORD_CACHES, kernel_of
from csa_conform.device.plan import DEVICE
from csa_conform.device.runner import DeviceRunner, DeviceStepResult
from csa_conform.errors import ContractError, CsaConformError, HostStageRejected, invalid_case
from csa_conform.golden import GoldenFile, GoldenStep
from csa_conform.numerics.bits import same_bits
from csa_conform.oracle import run_step
from csa_conform.profiles.numerics import REFERENCE
from csa_conform.spec import STATE_THREADING, Mode


@dataclass
class StepOutcome:
    """One step of a replayed stream: the oracle's payloads and what the device run made of it."""

    index: int
    expected: dict[str, dict[str, np.ndarray]]
    actual: DeviceStepResult | None = None
    expected_error: str | None = None
    failure_stage: str | None = None
    failure: str | None = None
    inputs: dict[str, np.ndarray] | None = None


# (case info, the step's outcome, the stage) -> the structural findings of its first divergent step
Diagnose = Callable[..., list]


@dataclass
class StageVerdict:
    stage: str
    placement: str
    status: str = NOT_COMPARED
    step: int | None = None
    message: str | None = None
    diffs: list[TensorDiff] = field(default_factory=list)
    kernel: str | None = None  # 'module.cu:entry' that wrote the stage (None on the host)
    diagnosis: list = field(default_factory=list)  # csa_conform.explain.patterns findings of the first divergent step


@dataclass
class CaseReport:
    case: str
    ratio: int
    steps: int
    compared_steps: int = 0
    rejected_steps: list[int] = field(default_factory=list)
    failure: dict | None = None
    stages: dict[str, StageVerdict] = field(default_factory=dict)
    findings: list[RunFinding] = field(default_factory=list)  # --repeat, --replay and --invariance
    errors: object = None  # diff --tolerance: the run's error statistics (csa_conform.compare.errorstats.Gap)
    invalid: str | None = None  # why the case cannot be judged (csa_conform.errors.invalid_case)

    @property
    def passed(self) -> bool:
        return (self.invalid is None and self.failure is None and not self.findings
                and all(verdict.status != DIVERGED for verdict in self.stages.values()))

    def diverged(self) -> list[StageVerdict]:
        return [verdict for verdict in self.stages.values() if verdict.status == DIVERGED]


def _expected(attrs: dict, output_names: Sequence[str], step: GoldenStep) -> dict[str, dict[str, np.ndarray]]:
    if step.stages:
        return step.stages
    return run_step(attrs, step.inputs, output_names).stages


def record_capacity(golden: GoldenFile, case_id: str) -> int:
    """The most records per batch row any accepted step of the case holds, read off the datasets' shapes."""
    return max(
        (entry.shape[1] for index in range(golden.step_count(case_id))
         if "expect_error" not in golden.step_attrs(case_id, index)
         for path, entry in golden.dataset_entries(case_id, index)
         if path.rpartition("/")[2] in RECORD_CACHES and entry.ndim == 3),
        default=0,
    )


def replay(golden: GoldenFile, case_id: str, runner: DeviceRunner, upto: int | None = None) -> Iterator[StepOutcome]:
    """Run a case's steps in order (through step ``upto``); stops after a step the device run refused.

    A runner that replays graphs runs the whole stream at its record capacity.
    """
    info = golden.case_info(case_id)
    capacity = record_capacity(golden, case_id) if runner.replayer is not None else None
    previous: tuple[GoldenStep, DeviceStepResult] | None = None
    last = info.step_count if upto is None else min(upto + 1, info.step_count)
    for index in range(last):
        step = golden.read_step(case_id, index)
        if step.expect_error is not None:
            yield StepOutcome(index, {}, expected_error=step.expect_error)
            continue
        expected = _expected(info.attrs, info.output_names, step)
        past = {}
        if runner.mode is Mode.CHAINED and previous is not None:
            golden_before, result_before = previous
            for present, past_name in STATE_THREADING.items():
                if present in result_before.present and past_name in step.inputs and same_bits(
                    golden_before.outputs.get(present, np.empty(0)), step.inputs[past_name]
                ):
                    past[past_name] = result_before.present[present]
        try:
            result = runner.run_step(
                info.attrs, step.inputs, info.output_names,
                reference=expected, past=past, case=case_id, step=index, capacity=capacity,
            )
        except HostStageRejected as error:
            yield StepOutcome(index, expected, failure_stage=error.stage, failure=str(error))
            return
        except ContractError as error:
            yield StepOutcome(index, expected, failure_stage="validation",
                              failure=f"this oracle rejects a step the golden file accepted: {error}")
            return
        previous = (step, result)
        yield StepOutcome(index, expected, actual=result, inputs=step.inputs)


def compare_step(outcome: StepOutcome, stages: Sequence[str], ulp: int = 0) -> list[TensorDiff]:
    """Every tensor comparison of the chosen stages for one step (failing and passing)."""
    expected = {stage: outcome.expected[stage] for stage in stages if stage in outcome.expected}
    actual = {stage: outcome.actual.stages.get(stage, {}) for stage in expected}
    return compare_payloads(expected, actual, ulp=ulp)


def first_divergence(outcomes: Iterable[StepOutcome], stages: Sequence[str], ulp: int = 0) -> dict | None:
    """The first step that diverges or that the device run refused, and there the earliest stage:
    ``step``, ``stage`` and either ``message`` (refused) or ``tensor``, its first ``element``, the
    stage's failing ``diffs`` and every ``diverged_stages`` of that step."""
    for outcome in outcomes:
        if outcome.expected_error is not None:
            continue
        if outcome.failure is not None:
            return {"step": outcome.index, "stage": outcome.failure_stage, "message": outcome.failure}
        failing = [diff for diff in compare_step(outcome, stages, ulp) if not diff.passed]
        if failing:
            first = min(failing, key=lambda diff: stages.index(diff.stage))
            return {
                "step": outcome.index,
                "stage": first.stage,
                "tensor": first.tensor,
                "element": first.first,
                "diffs": [diff for diff in failing if diff.stage == first.stage],
                "diverged_stages": sorted({diff.stage for diff in failing}, key=stages.index),
            }
    return None


def check_case(
    golden: GoldenFile, case_id: str, runner: DeviceRunner, stages: Sequence[str], ulp: int = 0,
    measure: bool = False, diagnose: Diagnose | None = None,
) -> CaseReport:
    """Per-stage verdicts of one case; a stage's first divergent step is kept with its failing tensors.

    ``measure`` also gathers the error statistics of every compared payload (``report.errors``), which
    ``diff --tolerance`` judges against a calibrated envelope. ``diagnose`` (the structural patterns of
    csa_conform.explain, passed in so that judging never depends on explaining) reads each stage's
    first divergent step. A case that cannot be read as a golden case is its own ``invalid`` verdict,
    every stage ``invalid``: the other cases of the file are still judged."""
    try:
        return _checked(golden, case_id, runner, stages, ulp, measure, diagnose)
    except CsaConformError as error:
        if not invalid_case(error):
            raise
        return CaseReport(case_id, 0, 0, stages={stage: StageVerdict(stage, "", INVALID) for stage in stages},
                          invalid=one_line(str(error)))


def _checked(golden: GoldenFile, case_id: str, runner: DeviceRunner, stages: Sequence[str], ulp: int,
             measure: bool, diagnose: Diagnose | None) -> CaseReport:
    info = golden.case_info(case_id)
    ratio = info.attrs.get("compression_ratio")
    if ratio in (4, 128):
        plan = runner.plan(int(ratio))
        placement = {stage.stage: stage.placement for stage in plan.stages}
    else:
        placement = {stage: "" for stage in stages}  # attributes the reference rejects: no step runs
    verdicts = {
        stage: StageVerdict(stage, placement[stage]) if stage in placement
        else StageVerdict(stage, "", NOT_APPLICABLE)
        for stage in stages
    }
    applicable = tuple(placement)
    report = CaseReport(case_id, ratio if isinstance(ratio, int) else 0, info.step_count, stages=verdicts)
    if measure:
        report.errors = Gap(REFERENCE, "device")
    for outcome in replay(golden, case_id, runner):
        if outcome.expected_error is not None:
            report.rejected_steps.append(outcome.index)
            continue
        if outcome.failure is not None:
            report.failure = {"step": outcome.index, "stage": outcome.failure_stage, "message": outcome.failure}
            if outcome.failure_stage in verdicts:
                verdict = verdicts[outcome.failure_stage]
                verdict.status, verdict.step, verdict.message = DIVERGED, outcome.index, outcome.failure
            break
        report.compared_steps += 1
        if measure:
            chosen = [stage for stage in stages if stage in applicable]
            report.errors.steps += 1
            report.errors.add_step(case_id, outcome.index, {stage: outcome.expected[stage] for stage in chosen
                                                            if stage in outcome.expected}, outcome.actual.stages)
        for finding in outcome.actual.findings:
            report.findings.append(RunFinding.of_device(finding, outcome.index))
            for stage in finding.stages:
                if stage in verdicts and verdicts[stage].status in (NOT_COMPARED, IDENTICAL):
                    verdicts[stage].status, verdicts[stage].step = finding.kind, outcome.index
        by_stage: dict[str, list[TensorDiff]] = {}
        for diff in compare_step(outcome, [stage for stage in stages if stage in applicable], ulp):
            by_stage.setdefault(diff.stage, []).append(diff)
        for stage, diffs in by_stage.items():
            verdict = verdicts[stage]
            failing = [diff for diff in diffs if not diff.passed]
            if failing and verdict.status != DIVERGED:
                verdict.status, verdict.step, verdict.diffs = DIVERGED, outcome.index, failing
                if verdict.placement == DEVICE:
                    verdict.kernel = kernel_of(stage, report.ratio, [diff.tensor for diff in failing])
                if diagnose is not None:
                    verdict.diagnosis = diagnose(info, outcome, stage)
            elif verdict.status == NOT_COMPARED:
                verdict.status = IDENTICAL
    return report
