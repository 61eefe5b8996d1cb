"""What each item of a case reports: ``verify``'s and ``diff``'s verdicts on the case, split by stage.

A case is checked once per side and its items read their share: the oracle side is
``verify_case`` (checksums, then the oracle replayed on the stored inputs), the device side is
``check_case`` (the kernels replayed against the golden payloads). An item passes only when its
own check ran and matched. It is skipped only when there is nothing for it to check here (no
device; no payload of its stage in the file; writeback in isolated mode, which the runner
assembles from the oracle's payloads) or when its check could not run because of a problem that
another item of the same case fails with, which the skip names.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

from csa_conform._base.statuses import DIVERGED, FAULT, HANG, IDENTICAL
from csa_conform.check.conformance import check_case
from csa_conform.check.model import CaseVerdict, StageVerdict, StepVerdict
from csa_conform.check.verify import reproduce_command, verify_case
from csa_conform.device.runner import DeviceRunner
from csa_conform.errors import ContractError, DeviceUnavailable, GoldenFormatError
from csa_conform.explain.patterns import stage_findings
from csa_conform.golden import CorruptDataset, GoldenFile
from csa_conform.spec import Mode

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
VALIDATION = "validation"
WRITEBACK = "writeback"
# verify compares a step's operator outputs as payload "outputs": they are what writeback returns.
OUTPUTS = "outputs"


@dataclass(frozen=True)
class Outcome:
    """An item's verdict: the failure's diagnosis lines, or the reason it was skipped."""

    status: str
    lines: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def passed() -> Outcome:
    return Outcome(PASSED)


def failed(lines: Sequence[str]) -> Outcome:
    return Outcome(FAILED, tuple(lines))


def skipped(reason: str) -> Outcome:
    return Outcome(SKIPPED, (reason,))


@dataclass(frozen=True)
class CaseItems:
    """The items of one case: an oracle and a device item per stage, and validation for rejected steps."""

    case_id: str
    stages: tuple[str, ...]
    validation: bool

    @property
    def oracle(self) -> tuple[str, ...]:
        return ((VALIDATION,) if self.validation else ()) + self.stages


# --- the oracle against the golden file ---------------------------------------------------


def oracle_outcomes(path: str, case: CaseItems) -> dict[str, Outcome]:
    try:
        with GoldenFile(path) as golden:
            result = verify_case(golden, case.case_id)
            held = set() if result.invalid else _held_payloads(golden, case.case_id)
            owners = _corrupt_owners(golden, case) if result.problem else set()
    except GoldenFormatError as error:
        line = f"FAIL {case.case_id}: {error} — reproduce: {reproduce_command(path, case.case_id)}"
        return {name: failed([line]) for name in case.oracle}
    if result.invalid:
        return {name: failed(result.failure_lines()) for name in case.oracle}
    if result.problem:
        return _corrupt_outcomes(result, owners, case)
    fragments: dict[str, list[StepVerdict]] = {name: [] for name in case.oracle}
    for step in result.steps:
        if step.passed:
            continue
        if step.expect_error is not None:
            fragments[VALIDATION].append(step)
            continue
        if step.problem:
            for stage in case.stages:
                fragments[stage].append(replace(step, diffs=[]))
        for diff in step.diffs:
            owner = WRITEBACK if diff.stage == OUTPUTS else diff.stage
            # a payload of a stage the case does not run (another tool's file) concerns them all
            for name in [owner] if owner in fragments else case.stages:
                fragments[name].append(replace(step, problem=None, diffs=[diff]))
    outcomes = {}
    for name, steps in fragments.items():
        if steps:
            outcomes[name] = failed(replace(result, steps=steps, problem=None).failure_lines())
        elif name == VALIDATION or name in held:
            outcomes[name] = passed()
        else:
            outcomes[name] = skipped(
                f"the golden file holds no {name} payload for {case.case_id}: nothing to verify "
                "(the device item compares with the oracle's)"
            )
    return outcomes


def _held_payloads(golden: GoldenFile, case_id: str) -> set[str]:
    """Stages whose payload the file stores for an accepted step (its outputs count as writeback)."""
    info = golden.case_info(case_id)
    return {
        owner
        for index in range(info.step_count) if index not in info.errors
        for name, _ in golden.dataset_entries(case_id, index)
        for owner in [_payload_owner(name)] if owner is not None
    }


def _payload_owner(entry: str) -> str | None:
    """The stage a step's dataset is a payload of ('stages/S/T' -> S, 'outputs/T' -> writeback)."""
    kind, _, rest = entry.partition("/")
    if kind == "stages":
        return rest.partition("/")[0]
    return WRITEBACK if kind == OUTPUTS else None


def _corrupt_owners(golden: GoldenFile, case: CaseItems) -> set[str]:
    """The items whose data the case's first corrupt dataset is.

    Payloads are hard links (a step's Y is attention's, writeback's and the output's; a stream's
    present_* can be the next step's past_*), so every path to the same dataset counts; an input
    or the kv history belongs to every item.
    """
    try:
        golden.verify_case_checksums(case.case_id)
    except CorruptDataset as corrupt:
        steps = f"/cases/{case.case_id}/steps/"
        linked = [_payload_owner(name.removeprefix(steps).partition("/")[2]) if name.startswith(steps) else None
                  for name in corrupt.links]
        if linked and None not in linked:
            return set(linked) & set(case.oracle) or set(case.oracle)
    return set(case.oracle)


def _corrupt_outcomes(result: CaseVerdict, owners: set[str], case: CaseItems) -> dict[str, Outcome]:
    lines = result.failure_lines()
    return {
        name: failed(lines) if name in owners
        else skipped(f"not verified: verify stops at a case's first corrupt dataset ({lines[0]})")
        for name in case.oracle
    }


# --- the device against the golden payloads -----------------------------------------------


def device_outcomes(
    path: str, case: CaseItems, runner: DeviceRunner, reproduce: Callable[[str, str], str],
    reproduce_fault: Callable[[str, str], str] | None = None,
) -> dict[str, Outcome]:
    """``reproduce(case, stage)`` is the diff command line that re-runs one stage of the case,
    ``reproduce_fault`` the one that re-runs a launch that faulted (under a memory checker)."""
    try:
        with GoldenFile(path) as golden:
            report = check_case(golden, case.case_id, runner, case.stages, diagnose=stage_findings)
    except GoldenFormatError as error:
        reason = f"not compared: the golden case cannot be read ({error}); its oracle items fail with it"
        return {stage: skipped(reason) for stage in case.stages}
    except DeviceUnavailable as error:
        return {
            stage: failed([f"{case.case_id} / {stage}: environment: {error}",
                           f"  reproduce: {reproduce(case.case_id, stage)}"])
            for stage in case.stages
        }
    except ContractError as error:  # the expected payloads of a step without stored stages
        return {
            stage: failed([f"{case.case_id}: this oracle rejects a step the golden file accepted: {error}",
                           f"  reproduce: {reproduce(case.case_id, 'all')}"])
            for stage in case.stages
        }
    if report.invalid:
        reason = f"not compared: the golden case is invalid ({report.invalid}); its oracle items fail with it"
        return {stage: skipped(reason) for stage in case.stages}
    return {stage: _device_outcome(report, report.stages[stage], runner.mode, reproduce, reproduce_fault or reproduce)
            for stage in case.stages}


def _device_outcome(
    report: CaseVerdict, verdict: StageVerdict, mode: Mode, reproduce: Callable[[str, str], str],
    reproduce_fault: Callable[[str, str], str],
) -> Outcome:
    stopped = report.stopped
    if verdict.status in (FAULT, HANG):
        return failed([f"{report.case} / {verdict.stage} (step {verdict.step}, [{verdict.kernel}]): {verdict.message}",
                       f"  reproduce: {reproduce_fault(report.case, verdict.stage)}"])
    if verdict.status == DIVERGED:
        lines = [f"{report.case} / {verdict.stage} (step {verdict.step}, {verdict.placement}):"]
        if verdict.message:
            lines.append(f"  {verdict.message}")
        lines += [f"  {diff.summary()}" for diff in verdict.diffs]
        return failed(lines + [f"  reproduce: {reproduce(report.case, verdict.stage)}"])
    if stopped is not None and stopped.stage not in report.stages:
        return failed([
            f"{report.case} step {stopped.step}: the run stopped at {stopped.stage}: {stopped.problem}",
            f"  reproduce: {reproduce(report.case, 'all')}",
        ])
    if stopped is not None:
        return skipped(
            f"not compared after step {stopped.step}: the run stopped at {stopped.stage}, "
            "whose device item fails with the reason"
        )
    if verdict.status == IDENTICAL and verdict.stage == WRITEBACK and mode is Mode.ISOLATED:
        return skipped(
            "isolated mode assembles writeback from the oracle's payloads of the stages that produce it "
            "(compared by their own items): no device output to compare"
        )
    if verdict.status == IDENTICAL:
        return passed()
    return failed([
        f"{report.case} / {verdict.stage}: {verdict.status}: no step of the case compared it",
        f"  reproduce: {reproduce(report.case, verdict.stage)}",
    ])
