"""The results document every checking command writes with ``--json`` (specs/results-document.md).

``verify``, ``diff``, ``bisect`` and ``explain`` describe a run the same way,
so one ``report`` turns any of them (or several shards of one) into CI
artefacts: which tool and golden file (path, sha256, schema version), which
kernels and build options, whether any kernel ran at all (``control_run``),
then cases -> failing steps -> stages -> tensors, each failure with its type,
its one-line message (expected and actual values included) and the command
that reproduces it. Passing steps and tensors are counted, not listed, and
empty fields are left out, so a clean run of the whole suite stays small.
``results.schema.json`` beside this module is the machine-readable schema;
the tests validate real output against it.

The result model every command builds is one typed tree: ``CaseEntry`` ->
``StepEntry`` (failing steps only) -> ``StageEntry`` -> the failing
TensorDiffs, with failures (``failure_entry``) and depth-mode findings
(csa_conform.check.findings.RunFinding.to_json) as their dicts; ``to_json``
gives each node's entry in the document. verify and bridge reach it from a
CaseResult (``CaseResult.entry``), the device commands from a conformance
CaseReport (``device_case``), bisect and gap build it directly. Then
``results_document(command, argv, cases, ...)`` with ``golden_reference``,
``kernel_provenance`` and ``control_run``; what only one command reports
(bisect's origin, explain's findings) goes in ``extra`` under its name.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Callable, Iterable

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from csa_conform import ORACLE_VERSION, __version__
from csa_conform._base import bounded_json
from csa_conform._base.statuses import INVALID
from csa_conform._base.terminal import escaped, one_line
from csa_conform.compare.bitwise import TensorDiff
from csa_conform.errors import UsageError

RESULTS_FORMAT = "csa-conform-results"
RESULTS_VERSION = 2
COMMANDS = ("verify", "diff", "bisect", "explain", "bench", "bridge")

# Failure types (JUnit's failure/@type).
BIT_MISMATCH = "bit-mismatch"
ULP_EXCEEDED = "ulp-exceeded"
DTYPE_MISMATCH = "dtype-mismatch"
SHAPE_MISMATCH = "shape-mismatch"
MISSING_TENSOR = "missing-tensor"
CORRUPT_DATASET = "corrupt-dataset"
REJECTION_MISMATCH = "rejection-mismatch"
STEP_REJECTED = "step-rejected"
BATCH_VARIANT = "batch-variant"
CHUNK_VARIANT = "chunk-variant"
SANITIZER = "sanitizer"
TIMING_REFUSED = "timing-refused"
SLOWER = "slow"
UNSUPPORTED = "unsupported"  # bridge: the runtime has no kernel for the operator
RUNNER_ERROR = "runner-error"  # bridge: the runner failed, crashed, hung or broke the protocol
ERROR = "error"
INVALID_CASE = INVALID  # a case that cannot be judged: its failure's type, and its verdict


def tensor_failure_type(diff: TensorDiff) -> str:
    if diff.problem:
        if diff.problem.startswith("dtype"):
            return DTYPE_MISMATCH
        if diff.problem.startswith("shape"):
            return SHAPE_MISMATCH
        return MISSING_TENSOR
    return ULP_EXCEEDED if diff.ulp_tolerance else BIT_MISMATCH


def tensor_entry(diff: TensorDiff) -> dict:
    """A failing tensor: its type, its one-line message and every non-empty field of the diff."""
    details = {key: value for key, value in diff.to_dict().items() if value is not None and key != "passed"}
    details.pop("stage")
    return {"type": tensor_failure_type(diff), "message": diff.summary(), **details}


@dataclass
class StepResult:
    """One step: passed, or why not (a problem line and/or the diverging tensors)."""

    step: int
    passed: bool
    compared: int = 0
    expect_error: str | None = None
    problem: str | None = None
    problem_type: str = STEP_REJECTED
    diffs: list[TensorDiff] = field(default_factory=list)


@dataclass
class CaseResult:
    """One case of a verify run (device commands build their case entries from CaseReport)."""

    case_id: str
    passed: bool
    reproduce: str
    family: str = ""
    steps: list[StepResult] = field(default_factory=list)
    problem: str | None = None
    time_s: float = 0.0
    invalid: str | None = None  # why the case cannot be judged (its one-line reason)

    def failure_lines(self) -> list[str]:
        """One line per failure, each ending with the command that reproduces the case (controls escaped)."""
        case, lines = escaped(self.case_id), []
        if self.invalid:
            lines.append(f"INVALID {case}: {self.invalid}")
        if self.problem:
            lines.append(f"FAIL {case}: {self.problem}")
        for step in self.steps:
            if step.problem:
                lines.append(f"FAIL {case} step {step.step}: {step.problem}")
            lines += [f"FAIL {case} step {step.step} {diff.summary()}" for diff in step.diffs]
        return [one_line(f"{line} — reproduce: {self.reproduce}") for line in lines]

    def entry(self) -> CaseEntry:
        failing = [step for step in self.steps if not step.passed]
        return CaseEntry(
            self.case_id,
            passed=self.passed,
            family=self.family,
            time_s=self.time_s,
            reproduce=self.reproduce,
            steps_total=len(self.steps),
            steps_compared=sum(1 for step in self.steps if step.compared),
            rejected_steps=[step.step for step in self.steps if step.expect_error is not None],
            failure=(failure_entry(INVALID_CASE, self.invalid, self.reproduce) if self.invalid else
                     failure_entry(CORRUPT_DATASET, self.problem, self.reproduce) if self.problem else None),
            steps=[
                StepEntry(
                    step.step,
                    failure=failure_entry(step.problem_type, step.problem, self.reproduce) if step.problem else None,
                    stages=_group_by_stage(step.diffs, self.reproduce),
                )
                for step in failing
            ],
        )


def _group_by_stage(diffs: Iterable[TensorDiff], reproduce: str) -> list[StageEntry]:
    stages: dict[str, list[TensorDiff]] = {}
    for diff in diffs:
        stages.setdefault(diff.stage, []).append(diff)
    return [StageEntry(stage, reproduce, found) for stage, found in stages.items()]


def failure_entry(kind: str, message: str, reproduce: str, **where) -> dict:
    """A failure that is not one tensor's: a corrupt dataset, a rejection, a run that stopped."""
    return {"type": kind, "message": message, "reproduce": reproduce, **where}


@dataclass
class StageEntry:
    """A divergent stage: its reproducer, the kernel that wrote it, its structural findings, its tensors."""

    stage: str
    reproduce: str
    diffs: list[TensorDiff]
    kernel: str | None = None
    diagnosis: list = field(default_factory=list)  # csa_conform.explain.patterns findings

    def to_json(self) -> dict:
        return {"stage": self.stage, "reproduce": self.reproduce, "kernel": self.kernel,
                "diagnosis": [finding.to_dict() for finding in self.diagnosis],
                "tensors": [tensor_entry(diff) for diff in self.diffs]}


@dataclass
class StepEntry:
    """A failing step: why it stopped (``failure``), the stages that diverged, what a depth mode found."""

    step: int
    failure: dict | None = None
    stages: list[StageEntry] = field(default_factory=list)
    findings: list[dict] = field(default_factory=list)  # RunFinding.to_json entries

    def to_json(self) -> dict:
        entry: dict = {"step": self.step}
        if self.failure is not None:
            entry["failure"] = self.failure
        entry["stages"] = [stage.to_json() for stage in self.stages]
        if self.findings:
            entry["findings"] = self.findings
        return entry


@dataclass
class CaseEntry:
    """One case of any run: the verdict, what was compared, and (failing only) steps -> stages -> tensors."""

    case: str
    passed: bool
    reproduce: str
    steps_total: int
    steps_compared: int
    family: str = ""
    time_s: float = 0.0
    rejected_steps: list[int] = field(default_factory=list)
    failure: dict | None = None
    verdicts: dict[str, str] | None = None  # device runs: each stage's status
    steps: list[StepEntry] = field(default_factory=list)

    def to_json(self) -> dict:
        """The case as the results document records it (empty optional fields left out)."""
        entry = {
            "case": self.case,
            "family": self.family,
            "passed": self.passed,
            "time_s": round(self.time_s, 3),
            "steps_total": self.steps_total,
            "steps_compared": self.steps_compared,
            "reproduce": self.reproduce,
        }
        if self.rejected_steps:
            entry["rejected_steps"] = self.rejected_steps
        if self.verdicts is not None:
            entry["verdicts"] = self.verdicts
        if self.failure is not None:
            entry["failure"] = self.failure
        entry["steps"] = [step.to_json() for step in self.steps]
        return entry


def device_case(report, reproduce: Callable[[str], str], time_s: float) -> CaseEntry:
    """A device case (csa_conform.check.conformance.CaseReport): per-stage verdicts and, per
    failing step, the stages and tensors that diverged; ``reproduce(stage)`` is the command for one stage."""
    steps: dict[int, StepEntry] = {}
    if report.failure is not None:
        failure = report.failure
        stage = failure["stage"] if failure["stage"] in report.stages else "all"
        steps[failure["step"]] = StepEntry(failure["step"], failure=failure_entry(
            STEP_REJECTED, failure["message"], reproduce(stage), stage=failure["stage"]))
    for finding in report.findings:
        steps.setdefault(finding.step, StepEntry(finding.step)).findings.append(
            finding.to_json(reproduce(finding.stages[0])))
    for verdict in report.diverged():
        if verdict.diffs:
            steps.setdefault(verdict.step, StepEntry(verdict.step)).stages.append(StageEntry(
                verdict.stage, reproduce(verdict.stage), verdict.diffs, verdict.kernel, verdict.diagnosis))
    return CaseEntry(
        report.case,
        passed=report.passed,
        time_s=time_s,
        reproduce=reproduce("all"),
        steps_total=report.steps,
        steps_compared=report.compared_steps,
        rejected_steps=report.rejected_steps,
        verdicts={stage: verdict.status for stage, verdict in report.stages.items()},
        failure=failure_entry(INVALID_CASE, report.invalid, reproduce("all")) if report.invalid else None,
        steps=[steps[index] for index in sorted(steps)],
    )


def file_sha256(path: str | Path) -> str | None:
    """sha256 of a file's bytes (None when it cannot be read)."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def golden_reference(path: str, schema_version: int | None, sha256: str | None = None) -> dict:
    """The golden file a run read: its path, the sha256 of its bytes (``sha256`` when the caller
    hashed them already) and its schema version."""
    return {"path": str(path), "sha256": sha256 or file_sha256(path), "schema_version": schema_version}


def kernel_provenance(provenance) -> dict:
    """A device run's kernels, toolchain and build options, with launches counted per module.

    One record per launch (case x step x stage) is what made an all-host
    document 610 KB; a report needs what ran and from which source, not when.
    Sorted, so shards and device workers merge into the unsharded run's list.
    """
    described = provenance.to_dict()
    counted: dict[tuple, dict] = {}
    for launch in provenance.launches:
        key = (launch.path, launch.module, launch.entry, launch.source_sha256, launch.block[0])
        found = counted.setdefault(key, {
            "path": launch.path, "module": launch.module, "stages": list(launch.stages), "count": 0,
            **({"entry": launch.entry, "source_sha256": launch.source_sha256, "block": launch.block[0]}
               if launch.entry else {}),
        })
        found["count"] += 1
    described["launches"] = [counted[key] for key in sorted(counted)]
    return described


def control_run(provenance) -> bool:
    """True when stages ran and every one ran on the host oracle: no kernel was launched. A run in which
    nothing ran at all (every step rejected by the reference) is no control run."""
    launches = provenance.launches
    return bool(launches) and not any(launch.path != "host-oracle" for launch in launches)


def results_document(
    command: str,
    argv: list[str],
    cases: list[dict],
    *,
    exit_code: int,
    golden: dict | None,
    kernels: dict | None = None,
    control: bool | None = None,
    options: dict | None = None,
    extra: dict | None = None,
) -> dict:
    """The whole document; ``extra`` holds what one command adds (bisect's origin, explain's findings)."""
    failed = sum(not case["passed"] for case in cases)
    document = {
        "format": RESULTS_FORMAT,
        "version": RESULTS_VERSION,
        "tool": {"name": "csa-conform", "version": __version__, "oracle_version": ORACLE_VERSION},
        "command": command,
        "argv": argv,
        "golden": golden,
        "kernels": kernels,
        "control_run": control,
        "options": options or {},
        "passed": failed == 0 and exit_code == 0,
        "exit_code": int(exit_code),
        "summary": {
            "cases": len(cases),
            "passed": len(cases) - failed,
            "failed": failed,
            "invalid": sum(invalid_entry(case) for case in cases),
            "steps": sum(case["steps_total"] for case in cases),
            "time_s": round(sum(case["time_s"] for case in cases), 3),
        },
        "cases": cases,
    }
    if extra:
        document.update(extra)
    return document


def invalid_entry(case: dict) -> bool:
    """Whether a case entry is the ``invalid`` verdict (the case could not be judged)."""
    return (case.get("failure") or {}).get("type") == INVALID_CASE


def error_document(command: str, argv: list[str], error: BaseException, exit_code: int,
                   golden_path: str | None = None) -> dict:
    """What a command that failed before it had results prints with --json: same shape, no cases."""
    golden = None if golden_path is None else {"path": golden_path, "sha256": file_sha256(golden_path),
                                               "schema_version": None}
    document = results_document(command, argv, [], exit_code=exit_code, golden=golden)
    document["error"] = {"type": type(error).__name__, "message": " ".join(str(error).split())}
    return document


def schema() -> dict:
    """The JSON Schema of the document (package data)."""
    return json.loads(resources.files("csa_conform").joinpath("results.schema.json").read_text())


def load_results(text: str, origin: str) -> dict:
    """A results document read back (the input of ``csa-conform report``), checked enough to render it."""
    document = bounded_json.loads(text, origin)
    if not isinstance(document, dict) or document.get("format") != RESULTS_FORMAT:
        raise UsageError(f"{origin}: not a csa-conform results document (write one with --json)")
    if document.get("version") != RESULTS_VERSION:
        raise UsageError(
            f"{origin}: results version {document.get('version')} is not {RESULTS_VERSION} "
            "(re-run the command with this csa-conform)"
        )
    problem = best_match(Draft202012Validator(schema()).iter_errors(document))
    if problem is not None:
        where = "/".join(str(part) for part in problem.absolute_path) or "the document"
        raise UsageError(f"{origin}: {where}: {problem.message} (not a results document this csa-conform wrote)")
    summary, cases = document["summary"], document["cases"]
    if summary["cases"] != len(cases) or summary["failed"] != sum(not case["passed"] for case in cases):
        raise UsageError(f"{origin}: summary does not count the cases it lists (edited by hand?)")
    return document
