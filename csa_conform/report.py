"""CI artefacts from results documents: one JUnit XML and one merged JSON for any number of runs.

Documents of the same command on the same golden file (the shards of one
run) merge into one test suite; each case is one test case, with its time,
and a failing case carries one ``failure`` whose ``type`` is its first
failure's and whose message names the tensor, the first differing element
and the expected and actual values. The text lists every failure and the
command that reproduces it. The XML follows the common JUnit schema
(tests/cli/junit.xsd checks it).
"""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree

from csa_conform.results import ERROR, RESULTS_FORMAT, RESULTS_VERSION


def _failures(case: dict) -> list[dict]:
    """Every failure of a case, in order: the case's own, then per step its own and its tensors'."""
    found = [case["failure"]] if case.get("failure") else []
    for step in case.get("steps", []):
        where = f"step {step['step']}"
        if step.get("failure"):
            failure = step["failure"]
            found.append({**failure, "message": f"{where}: {failure['message']}"})
        found.extend({**finding, "message": f"{where}: {finding['message']}"}
                     for finding in step.get("nondeterministic", []))
        for stage in step.get("stages", []):
            found.extend(
                {"type": tensor["type"], "message": f"{where} {tensor['message']}", "reproduce": stage["reproduce"]}
                for tensor in stage["tensors"]
            )
    return found


def _suite_key(document: dict) -> tuple:
    golden = document.get("golden") or {}
    return document["command"], golden.get("path"), golden.get("sha256")


def _seconds(value: float) -> str:
    return f"{value:.3f}"


def junit_xml(documents: list[dict]) -> str:
    """JUnit XML: one testsuite per command and golden file, one testcase per case."""
    suites = ElementTree.Element("testsuites")
    grouped: dict[tuple, list[dict]] = {}
    for document in documents:
        grouped.setdefault(_suite_key(document), []).append(document)
    totals = {"tests": 0, "failures": 0, "errors": 0, "time": 0.0}
    for (command, path, _), members in grouped.items():
        cases = [case for document in members for case in document["cases"]]
        errors = [document for document in members if document.get("error")]
        failed = sum(not case["passed"] for case in cases)
        time = sum(case["time_s"] for case in cases)
        suite = ElementTree.SubElement(
            suites, "testsuite",
            name=f"csa-conform {command} {path or ''}".rstrip(),
            tests=str(len(cases) + len(errors)),
            failures=str(failed + len(errors)),
            errors="0",
            time=_seconds(time),
        )
        for case in cases:
            testcase = ElementTree.SubElement(
                suite, "testcase", classname=f"{command}.{case.get('family') or 'case'}", name=case["case"],
                time=_seconds(case["time_s"]),
            )
            if not case["passed"]:
                failures = _failures(case) or [{"type": "failed", "message": "failed", "reproduce": case["reproduce"]}]
                failure = ElementTree.SubElement(
                    testcase, "failure", type=failures[0]["type"], message=failures[0]["message"]
                )
                failure.text = "\n".join(
                    f"[{entry['type']}] {entry['message']}\n  reproduce: {entry['reproduce']}" for entry in failures
                )
        for document in errors:
            # The run itself failed (exit code 2 or 4): one failing test case says why.
            testcase = ElementTree.SubElement(suite, "testcase", classname=f"{command}.run", name="run", time="0.000")
            failure = ElementTree.SubElement(testcase, "failure", type=ERROR, message=document["error"]["message"])
            failure.text = f"exit code {document['exit_code']}: {' '.join(document['argv'])}"
        totals["tests"] += len(cases) + len(errors)
        totals["failures"] += failed + len(errors)
        totals["time"] += time
    for key in ("tests", "failures", "errors"):
        suites.set(key, str(totals[key]))
    suites.set("time", _seconds(totals["time"]))
    ElementTree.indent(suites)
    return ElementTree.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def merged_summary(documents: list[dict]) -> dict:
    """The JSON artefact: every run document plus a total."""
    cases = sum(document["summary"]["cases"] for document in documents)
    failed = sum(document["summary"]["failed"] for document in documents)
    errors = sum(1 for document in documents if document.get("error"))
    return {
        "format": RESULTS_FORMAT,
        "version": RESULTS_VERSION,
        "passed": failed == 0 and errors == 0 and all(document["passed"] for document in documents),
        "summary": {"runs": len(documents), "cases": cases, "failed": failed, "errors": errors},
        "runs": documents,
    }
