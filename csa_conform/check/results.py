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

The document's nodes are one typed tree: ``CaseEntry`` -> ``StepEntry``
(failing steps only) -> ``StageEntry`` -> the failing TensorDiffs, with every
failure that is not one tensor's (a corrupt dataset, a rejection, a stopped
run, a depth mode's finding) a ``Failure``; ``to_json`` gives each node's
entry in the document. Every check but bisect reaches it from its result
(csa_conform.check.model.CaseVerdict.entry); bisect builds it from its first
divergence (a StepVerdict). Then
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
from typing import Any

from csa_conform import ORACLE_VERSION, __version__
from csa_conform._base.statuses import INVALID
from csa_conform.compare.bitwise import TensorDiff

RESULTS_FORMAT = "csa-conform-results"
RESULTS_VERSION = 2
COMMANDS = ("verify", "diff", "bisect", "explain", "bench", "bridge", "mutate")

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


@dataclass(frozen=True)
class Failure:
    """A failure that is not one tensor's: a corrupt dataset, a rejection, a run that stopped, a finding;
    ``where`` holds what else its entry records (the stage, a finding's details)."""

    type: str
    message: str
    reproduce: str
    where: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "message": self.message, "reproduce": self.reproduce, **self.where}


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
    failure: Failure | None = None
    stages: list[StageEntry] = field(default_factory=list)
    findings: list[Failure] = field(default_factory=list)  # csa_conform.check.findings.RunFinding.failure

    def to_json(self) -> dict:
        entry: dict = {"step": self.step}
        if self.failure is not None:
            entry["failure"] = self.failure.to_json()
        entry["stages"] = [stage.to_json() for stage in self.stages]
        if self.findings:
            entry["findings"] = [finding.to_json() for finding in self.findings]
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
    failure: Failure | None = None
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
            entry["failure"] = self.failure.to_json()
        entry["steps"] = [step.to_json() for step in self.steps]
        return entry


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
               if launch.entry and launch.path == "nvrtc" else {"entry": launch.entry} if launch.entry else {}),
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
