"""Plain, serialisable results of a run (verify, diff) and their CI renderings.

A run is a list of ``CaseResult``; each names its failing steps, stages and
tensors (``TensorDiff``) and carries the command line that reproduces just
that case. ``to_dict`` gives the ``--json`` document, ``junit_xml`` the
JUnit artefact CI systems render; ``load_run`` reads a ``--json`` document
back (the input of ``csa-conform report``).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field

from csa_conform.diff import TensorDiff
from csa_conform.errors import UsageError

RESULTS_FORMAT = "csa-conform-results"
RESULTS_VERSION = 1


@dataclass
class StepResult:
    """One step: passed, or why not (a problem line and/or the diverging tensors)."""

    step: int
    passed: bool
    compared: int = 0
    expect_error: str | None = None
    problem: str | None = None
    diffs: list[TensorDiff] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "step": self.step,
            "passed": self.passed,
            "compared": self.compared,
            "expect_error": self.expect_error,
            "problem": self.problem,
            "diffs": [diff.to_dict() for diff in self.diffs],
        }


@dataclass
class CaseResult:
    case_id: str
    passed: bool
    reproduce: str
    family: str = ""
    steps: list[StepResult] = field(default_factory=list)
    problem: str | None = None

    def failure_lines(self) -> list[str]:
        """One line per failure, each ending with the command that reproduces the case."""
        lines = []
        if self.problem:
            lines.append(f"FAIL {self.case_id}: {self.problem}")
        for step in self.steps:
            if step.problem:
                lines.append(f"FAIL {self.case_id} step {step.step}: {step.problem}")
            lines += [f"FAIL {self.case_id} step {step.step} {diff.summary()}" for diff in step.diffs]
        return [f"{line} — reproduce: {self.reproduce}" for line in lines]

    def to_dict(self) -> dict:
        return {
            "case_id": self.case_id,
            "family": self.family,
            "passed": self.passed,
            "problem": self.problem,
            "reproduce": self.reproduce,
            "steps": [step.to_dict() for step in self.steps],
        }


def run_document(command: str, source: str, argv: str, cases: list[CaseResult]) -> dict:
    """The ``--json`` document of a run (deterministic: no timings, cases in order)."""
    steps = sum(len(case.steps) for case in cases)
    failed = sum(not case.passed for case in cases)
    return {
        "format": RESULTS_FORMAT,
        "version": RESULTS_VERSION,
        "command": command,
        "file": source,
        "argv": argv,
        "passed": failed == 0,
        "summary": {"cases": len(cases), "passed": len(cases) - failed, "failed": failed, "steps": steps},
        "cases": [case.to_dict() for case in cases],
    }


def load_run(text: str, origin: str) -> dict:
    """A ``--json`` run document, checked enough to render it."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise UsageError(f"{origin}: not JSON ({error})") from None
    if not isinstance(document, dict) or document.get("format") != RESULTS_FORMAT:
        raise UsageError(f"{origin}: not a csa-conform results document (write one with --json)")
    if document.get("version") != RESULTS_VERSION:
        raise UsageError(
            f"{origin}: results version {document.get('version')} is not {RESULTS_VERSION}"
        )
    _check_shape(document, origin)
    return document


def _check_shape(document: dict, origin: str) -> None:
    """Refuse a document whose summary or cases the renderings below could not read."""
    summary = document.get("summary")
    counts = ("cases", "failed")
    if not isinstance(summary, dict) or not all(_count(summary.get(key)) for key in counts):
        raise UsageError(f"{origin}: 'summary' must be an object with integer 'cases' and 'failed'")
    for key in ("command", "file"):
        if not isinstance(document.get(key), str):
            raise UsageError(f"{origin}: {key!r} must be a string")
    cases = document.get("cases")
    if not isinstance(cases, list) or len(cases) != summary["cases"]:
        raise UsageError(f"{origin}: 'cases' must be a list of summary.cases ({summary['cases']}) results")
    for position, case in enumerate(cases):
        if not (
            isinstance(case, dict)
            and isinstance(case.get("case_id"), str)
            and isinstance(case.get("passed"), bool)
            and isinstance(case.get("reproduce"), str)
            and isinstance(case.get("steps", []), list)
        ):
            raise UsageError(f"{origin}: cases[{position}] is not a case result (case_id, passed, reproduce, steps)")
        if not all(_step_result(step) for step in case.get("steps", [])):
            raise UsageError(f"{origin}: cases[{position}] has a step that is not a step result")
    if sum(not case["passed"] for case in cases) != summary["failed"]:
        raise UsageError(f"{origin}: summary.failed does not count the failed cases")


def _step_result(step) -> bool:
    if not isinstance(step, dict) or not _count(step.get("step")) or not isinstance(step.get("diffs", []), list):
        return False
    if not isinstance(step.get("problem"), (str, type(None))):
        return False
    return all(
        isinstance(diff, dict)
        and isinstance(diff.get("stage"), str)
        and isinstance(diff.get("tensor"), str)
        and (isinstance(diff.get("problem"), str) or _count(diff.get("failures")))
        and isinstance(diff.get("first") or {}, dict)
        for diff in step.get("diffs", [])
    )


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _failure_text(case: dict) -> list[str]:
    lines = []
    if case.get("problem"):
        lines.append(case["problem"])
    for step in case.get("steps", []):
        if step.get("problem"):
            lines.append(f"step {step['step']}: {step['problem']}")
        for diff in step.get("diffs", []):
            first = diff.get("first") or {}
            where = f" first at {first['coords']}" if first.get("coords") else ""
            lines.append(
                f"step {step['step']} {diff['stage']}/{diff['tensor']}: "
                f"{diff.get('problem') or str(diff['failures']) + ' elements differ'}{where}"
            )
    return lines


def junit_xml(documents: list[dict]) -> str:
    """JUnit XML: one testsuite per run document, one testcase per case."""
    suites = ElementTree.Element("testsuites")
    for document in documents:
        summary = document["summary"]
        suite = ElementTree.SubElement(
            suites,
            "testsuite",
            name=f"csa-conform {document['command']} {document['file']}",
            tests=str(summary["cases"]),
            failures=str(summary["failed"]),
            errors="0",
        )
        for case in document["cases"]:
            testcase = ElementTree.SubElement(
                suite, "testcase", classname=case.get("family") or document["command"], name=case["case_id"]
            )
            if not case["passed"]:
                lines = _failure_text(case)
                failure = ElementTree.SubElement(
                    testcase, "failure", message=lines[0] if lines else "failed"
                )
                failure.text = "\n".join(lines + [f"reproduce: {case['reproduce']}"])
    ElementTree.indent(suites)
    return ElementTree.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def merged_summary(documents: list[dict]) -> dict:
    """The JSON artefact: every run document plus a total."""
    cases = sum(document["summary"]["cases"] for document in documents)
    failed = sum(document["summary"]["failed"] for document in documents)
    return {
        "format": RESULTS_FORMAT,
        "version": RESULTS_VERSION,
        "passed": failed == 0,
        "summary": {"runs": len(documents), "cases": cases, "failed": failed},
        "runs": documents,
    }
