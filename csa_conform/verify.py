"""Replay a golden file through the oracle: the regression gate behind ``csa-conform verify``.

Every case of any conforming file (ours or another tool's) is checked in two
passes: every dataset of the case against its sha256, then every step
re-run with its inputs exactly as stored, requiring bit-identical outputs
and stage payloads (only the stages the file holds) — or, for a step with
``expect_error``, exactly that rejection message.
"""

from __future__ import annotations

import shlex

from csa_conform.diff import compare_payloads
from csa_conform.errors import ContractError, CorruptDataset
from csa_conform.goldens import GoldenFile, GoldenStep
from csa_conform.oracle import run_step
from csa_conform.results import REJECTION_MISMATCH, CaseResult, StepResult

__all__ = ["reproduce_command", "verify_case", "verify_step"]


def reproduce_command(path: str, case_id: str) -> str:
    return f"csa-conform verify {shlex.quote(path)} --case {shlex.quote(case_id)}"


def verify_step(index: int, attrs: dict, output_names, step: GoldenStep) -> StepResult:
    try:
        result = run_step(attrs, step.inputs, list(output_names))
    except ContractError as rejection:
        message = str(rejection)
        if step.expect_error is None:
            return StepResult(index, False, problem=f"oracle rejected the stored step: {message}")
        if message != step.expect_error:
            return StepResult(
                index,
                False,
                expect_error=step.expect_error,
                problem=f"expected rejection {step.expect_error!r}, oracle said {message!r}",
                problem_type=REJECTION_MISMATCH,
            )
        return StepResult(index, True, expect_error=step.expect_error)
    if step.expect_error is not None:
        return StepResult(
            index,
            False,
            expect_error=step.expect_error,
            problem=f"expected rejection {step.expect_error!r}, but the oracle accepted the step",
            problem_type=REJECTION_MISMATCH,
        )
    expected = {"outputs": step.outputs, **step.stages}
    actual = {"outputs": result.outputs}
    actual.update({stage: result.stages[stage] for stage in step.stages if stage in result.stages})
    diffs = compare_payloads(expected, actual)
    failing = [diff for diff in diffs if not diff.passed]
    return StepResult(index, not failing, compared=len(diffs), diffs=failing)


def verify_case(path: str, case_id: str) -> CaseResult:
    """Checksums first (a tampered file is reported as such, naming the dataset), then replay."""
    reproduce = reproduce_command(path, case_id)
    with GoldenFile(path) as golden:
        info = golden.case_info(case_id)
        result = CaseResult(case_id, True, reproduce, family=info.family)
        try:
            golden.verify_case_checksums(case_id)
            for index in range(info.step_count):
                step = golden.read_step(case_id, index)
                outcome = verify_step(index, info.attrs, info.output_names, step)
                result.steps.append(outcome)
        except CorruptDataset as corrupt:
            result.problem = f"corrupt dataset {corrupt.dataset}: {corrupt.reason}"
    result.passed = result.problem is None and all(step.passed for step in result.steps)
    return result
