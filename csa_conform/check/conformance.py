"""A golden case replayed on a device runner and compared with the oracle, stage by stage.

The expected side is the golden file's stage payloads (or, for a file that
carries none, the oracle run on the golden inputs). In chained mode a step's
past_* inputs are the previous step's present_* from this run wherever the
golden stream itself threads them (bit-identical golden tensors), so device
state flows through a stream exactly as in production. Steps the oracle
rejects are not run: there is nothing to compare. A launch that faulted or
hung (csa_conform.errors.KernelFault) ends the case there, as a refused step
does: its stages' verdict is ``fault`` or ``hang``, and the run goes on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from csa_conform._base.statuses import DIVERGED, FAULT, HANG, IDENTICAL, INVALID, NOT_APPLICABLE, NOT_COMPARED
from csa_conform._base.terminal import one_line
from csa_conform.check.findings import RunFinding
from csa_conform.check.model import CaseVerdict, StageVerdict, StepVerdict
from csa_conform.compare.bitwise import TensorDiff, compare_payloads
from csa_conform.compare.errorstats import Gap
from csa_conform.device.launches import RECORD_CACHES
from csa_conform.device.plan import DEVICE
from csa_conform.device.runner import DeviceRunner, DeviceStepResult
from csa_conform.errors import ContractError, CsaConformError, HostStageRejected, KernelFault, invalid_case
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
    fault: KernelFault | None = None  # the launch that faulted or hung (failure_stage its first stage)

    @property
    def failure_type(self) -> str | None:
        """The kind of the step's failure: ``fault``, ``hang`` or (a refused step) None."""
        return self.fault.kind if self.fault is not None else None


# (case info, the step's outcome, the stage) -> the structural findings of its first divergent step
Diagnose = Callable[..., list]


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
        except KernelFault as fault:
            stage = fault.launch.stages[0] if fault.launch is not None else "all"
            yield StepOutcome(index, expected, failure_stage=stage, failure=str(fault), fault=fault)
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


def first_divergence(outcomes: Iterable[StepOutcome], stages: Sequence[str], ulp: int = 0) -> StepVerdict | None:
    """The first step that diverges or that the device run refused, and there the earliest stage: refused,
    its ``problem``; diverged, the stage's failing ``diffs`` and every ``diverged_stages`` of that step."""
    for outcome in outcomes:
        if outcome.expected_error is not None:
            continue
        if outcome.failure is not None:
            return StepVerdict(outcome.index, False, problem=outcome.failure, stage=outcome.failure_stage,
                               **_fault_type(outcome))
        failing = [diff for diff in compare_step(outcome, stages, ulp) if not diff.passed]
        if failing:
            first = min(failing, key=lambda diff: stages.index(diff.stage))
            return StepVerdict(
                outcome.index, False, compared=True, stage=first.stage,
                diffs=[diff for diff in failing if diff.stage == first.stage],
                diverged_stages=tuple(sorted({diff.stage for diff in failing}, key=stages.index)),
            )
    return None


def check_case(
    golden: GoldenFile, case_id: str, runner: DeviceRunner, stages: Sequence[str], ulp: int = 0,
    measure: bool = False, diagnose: Diagnose | None = None,
) -> CaseVerdict:
    """Per-stage verdicts of one case; a stage's first divergent step is kept with its failing tensors.

    ``measure`` also gathers the error statistics of every compared payload (``errors``), which
    ``diff --tolerance`` judges against a calibrated envelope. ``diagnose`` (the structural patterns of
    csa_conform.explain, passed in so that judging never depends on explaining) reads each stage's
    first divergent step. A case that cannot be read as a golden case is its own ``invalid`` verdict,
    every stage ``invalid``: the other cases of the file are still judged."""
    try:
        return _checked(golden, case_id, runner, stages, ulp, measure, diagnose)
    except CsaConformError as error:
        if not invalid_case(error):
            raise
        return CaseVerdict(case_id, stages={stage: StageVerdict(stage, "", INVALID) for stage in stages},
                           invalid=one_line(str(error)))


def _checked(golden: GoldenFile, case_id: str, runner: DeviceRunner, stages: Sequence[str], ulp: int,
             measure: bool, diagnose: Diagnose | None) -> CaseVerdict:
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
    report = CaseVerdict(case_id, ratio=ratio if isinstance(ratio, int) else 0, step_count=info.step_count,
                         stages=verdicts)
    if measure:
        report.errors = Gap(REFERENCE, "device")
    for outcome in replay(golden, case_id, runner):
        if outcome.expected_error is not None:
            report.steps.append(StepVerdict(outcome.index, expect_error=outcome.expected_error))
            continue
        if outcome.failure is not None:
            report.steps.append(StepVerdict(outcome.index, False, problem=outcome.failure,
                                            stage=outcome.failure_stage, **_fault_type(outcome)))
            if outcome.fault is not None:
                _faulted(verdicts, outcome)
            elif outcome.failure_stage in verdicts:
                verdict = verdicts[outcome.failure_stage]
                verdict.status, verdict.step, verdict.message = DIVERGED, outcome.index, outcome.failure
            break
        step = StepVerdict(outcome.index, compared=True)
        report.steps.append(step)
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
            step.passed = step.passed and not failing
            if failing and verdict.status != DIVERGED:
                verdict.status, verdict.step, verdict.diffs = DIVERGED, outcome.index, failing
                if verdict.placement == DEVICE:
                    verdict.kernel = runner.kernel_of(stage, report.ratio, [diff.tensor for diff in failing])
                if diagnose is not None:
                    verdict.diagnosis = diagnose(info, outcome, stage)
            elif verdict.status == NOT_COMPARED:
                verdict.status = IDENTICAL
    return report


def _fault_type(outcome: StepOutcome) -> dict:
    """StepVerdict's ``problem_type`` for a step that faulted or hung (none for a refused step)."""
    return {"problem_type": outcome.failure_type} if outcome.fault is not None else {}


def _faulted(verdicts: dict[str, StageVerdict], outcome: StepOutcome) -> None:
    """Every stage the faulting launch computes gets its verdict, ``fault`` or ``hang``, and the launch."""
    fault = outcome.fault
    launch = fault.launch
    for stage in launch.stages if launch is not None else ():
        if stage in verdicts:
            verdict = verdicts[stage]
            verdict.status = HANG if fault.kind == HANG else FAULT
            verdict.step, verdict.message = outcome.index, outcome.failure
            verdict.kernel = f"{launch.module}.cu:{launch.entry}"
