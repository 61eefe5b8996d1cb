"""CI artefacts from results documents: one JUnit XML and one merged JSON for any number of runs.

The shards of one run (documents whose ``options`` name a ``shard``) first
merge back into the document the unsharded run writes (csa_conform._base.shards).
Documents of the same command on the same golden file merge into one test
suite; each case is one test case, with its time, and a failing case
carries one ``failure`` whose ``type`` is its first failure's and whose
message names the tensor, the first differing element and the expected and
actual values. The text lists every failure and the command that
reproduces it. The XML follows the common JUnit schema
(tests/cli/junit.xsd checks it) and stays well-formed whatever the
documents hold: characters XML 1.0 cannot carry (C0 controls but tab and
newline, DEL, C1 controls, lone surrogates) are written as escapes
(``\x1b``), and a time that is not a finite number of seconds as 0.
"""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ElementTree

from csa_conform._base.shards import SHARD_OPTION, interleave, parse_shard, without_shard
from csa_conform.check.results import ERROR, RESULTS_FORMAT, RESULTS_VERSION, SANITIZER, results_document
from csa_conform.errors import UsageError
from csa_conform.exitcodes import ExitCode
from csa_conform.mutate.score import below, merge_sections


def _failures(case: dict) -> list[dict]:
    """Every failure of a case, in order: the case's own, then per step its own and its tensors'."""
    found = [case["failure"]] if case.get("failure") else []
    for step in case.get("steps", []):
        where = f"step {step['step']}"
        if step.get("failure"):
            failure = step["failure"]
            found.append({**failure, "message": f"{where}: {failure['message']}"})
        found.extend({**finding, "message": f"{where}: {finding['message']}"}
                     for finding in step.get("findings", []))
        for stage in step.get("stages", []):
            found.extend(
                {"type": tensor["type"], "message": f"{where} {tensor['message']}", "reproduce": stage["reproduce"]}
                for tensor in stage["tensors"]
            )
    return found


def _suite_key(document: dict) -> tuple:
    golden = document.get("golden") or {}
    return document["command"], golden.get("path"), golden.get("sha256")


# What XML 1.0 cannot hold, plus DEL and the C1 controls it allows but no terminal should get.
_NOT_XML = re.compile("[^\t\n\r\x20-\x7e\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _seconds(value: float) -> str:
    return f"{value:.3f}" if math.isfinite(value) and value >= 0 else "0.000"


def _xml_safe(text: str) -> str:
    return _NOT_XML.sub(lambda found: repr(found[0])[1:-1], text)


def _make_well_formed(root: ElementTree.Element) -> None:
    for element in root.iter():
        element.attrib = {key: _xml_safe(value) for key, value in element.attrib.items()}
        if element.text:
            element.text = _xml_safe(element.text)


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
        for document in members:
            if document.get("mutate"):
                counted = _mutant_cases(suite, document["mutate"])
                suite.set("tests", str(int(suite.get("tests")) + counted[0]))
                suite.set("failures", str(int(suite.get("failures")) + counted[1]))
                totals["tests"] += counted[0]
                totals["failures"] += counted[1]
            if document.get("sanitizer"):
                failed_run = _sanitizer_case(suite, command, document["sanitizer"])
                suite.set("tests", str(int(suite.get("tests")) + 1))
                suite.set("failures", str(int(suite.get("failures")) + failed_run))
                totals["tests"] += 1
                totals["failures"] += failed_run
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
    _make_well_formed(suites)
    ElementTree.indent(suites)
    return ElementTree.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def _mutant_cases(suite, section: dict) -> tuple[int, int]:
    """One test case per mutant judged (a survivor fails: the suite passes it); (tests, failures)."""
    tests = failures = 0
    for mutant in section["mutants"]:
        if mutant["verdict"] == "did-not-build":
            continue
        testcase = ElementTree.SubElement(suite, "testcase", classname=f"mutate.{mutant['operator']}",
                                          name=mutant["id"], time=_seconds(mutant["time_s"]))
        tests += 1
        if mutant["verdict"] == "survived":
            failure = ElementTree.SubElement(testcase, "failure", type="survived",
                                             message=f"{mutant['file']}:{mutant['line']}: {mutant['change']}")
            failure.text = f"- {mutant['before']}\n+ {mutant['after']}"
            failures += 1
    return tests, failures


def _sanitizer_case(suite, command: str, sanitized: dict) -> int:
    """compute-sanitizer's report names kernels, not cases: one test case per sanitized run (1 if it failed)."""
    testcase = ElementTree.SubElement(suite, "testcase", classname=f"{command}.sanitizer", name=sanitized["tool"],
                                      time="0.000")
    findings = sanitized["findings"]
    if not findings and not sanitized["error_count"]:
        return 0
    message = findings[0]["summary"] if findings else f"{sanitized['error_count']} errors"
    failure = ElementTree.SubElement(testcase, "failure", type=SANITIZER, message=message)
    failure.text = "\n".join([finding["summary"] for finding in findings] + [f"reproduce: {sanitized['reproduce']}"])
    return 1


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


def _shard_key(document: dict) -> tuple:
    options = {key: value for key, value in document["options"].items() if key != SHARD_OPTION}
    golden = document.get("golden") or {}
    return document["command"], golden.get("path"), golden.get("sha256"), json.dumps(options, sort_keys=True)


def merge_shards(documents: list[dict]) -> list[dict]:
    """Every run's shards merged into one document (in the place of its first shard); others as given."""
    groups: dict[tuple, list[dict]] = {}
    order: list = []
    for document in documents:
        if SHARD_OPTION not in document.get("options", {}):
            order.append(document)
            continue
        key = _shard_key(document)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(document)
    return [item if isinstance(item, dict) else _merge(groups[item]) for item in order]


def _merge(shards: list[dict]) -> dict:
    first = shards[0]
    parsed = [parse_shard(shard["options"][SHARD_OPTION], "options.shard") for shard in shards]
    total = parsed[0].total
    where = f"{first['command']} {(first.get('golden') or {}).get('path')}"
    if any(shard.total != total for shard in parsed):
        raise UsageError(f"shards of {where} disagree on the shard count: {', '.join(map(str, parsed))}")
    indexes = sorted(shard.index for shard in parsed)
    if indexes != list(range(1, total + 1)):
        missing = sorted(set(range(1, total + 1)) - set(indexes))
        repeated = sorted({index for index in indexes if indexes.count(index) > 1})
        problem = "; ".join(filter(None, (
            missing and f"missing {', '.join(f'{index}/{total}' for index in missing)}",
            repeated and f"given twice {', '.join(f'{index}/{total}' for index in repeated)}",
        )))
        raise UsageError(f"shards of {where} do not add up to one run: {problem}")
    ordered = [shard for _, shard in sorted(zip((p.index for p in parsed), shards), key=lambda pair: pair[0])]
    controls = [shard["control_run"] for shard in ordered]
    document = results_document(
        first["command"], without_shard(first["argv"]), interleave([shard["cases"] for shard in ordered]),
        exit_code=_exit_code([shard["exit_code"] for shard in ordered]),
        golden=first["golden"],
        kernels=_merge_kernels([shard["kernels"] for shard in ordered]),
        control=None if None in controls else all(controls),
        options={key: value for key, value in first["options"].items() if key != SHARD_OPTION},
        extra={**(_merge_explain([shard.get("explain") for shard in ordered]) or {}),
               **_merge_mutate([shard.get("mutate") for shard in ordered])} or None,
    )
    document["tool"] = first["tool"]
    if "mutate" in document and document["exit_code"] in (ExitCode.OK, ExitCode.DIVERGED):
        # a shard's score is not the run's: the gate is the merged score against --min-score
        document["exit_code"] = int(ExitCode.DIVERGED if below(document["mutate"]) else ExitCode.OK)
        document["passed"] = document["exit_code"] == ExitCode.OK
    return document


def _merge_mutate(sections: list[dict | None]) -> dict:
    """The shards' mutants as the unsharded run lists them (csa_conform.mutate.score.merge_sections)."""
    present = [section for section in sections if section is not None]
    return {"mutate": merge_sections(present)} if present else {}


def _merge_explain(sections: list[dict | None]) -> dict | None:
    """The shards' explanations as the unsharded run lists them: in case order, counts summed."""
    present = [section for section in sections if section is not None]
    if not present:
        return None
    explanations = sorted((entry for section in present for entry in section["explanations"]),
                          key=lambda entry: entry["case"])
    keys = dict.fromkeys(key for section in present for key in section["summary"])  # a shard may predate a count
    summary = {key: sum(section["summary"].get(key, 0) for section in present) for key in keys}
    libm = {entry["where"]: entry for section in present for entry in section.get("device_libm", [])}
    return {"explain": {"summary": summary, "device_libm": list(libm.values()), "explanations": explanations}}


def _exit_code(codes: list[int]) -> int:
    """OK when every shard passed, DIVERGED when some diverged, else the first shard's other failure."""
    failed = [code for code in codes if code != ExitCode.OK]
    if not failed:
        return ExitCode.OK
    return next((code for code in failed if code != ExitCode.DIVERGED), ExitCode.DIVERGED)


def _merge_kernels(described: list[dict | None]) -> dict | None:
    present = [kernels for kernels in described if kernels is not None]
    if not present:
        return None
    merged = dict(present[0])
    merged["device"] = next((kernels["device"] for kernels in present if kernels.get("device")), None)
    counted: dict[tuple, dict] = {}
    for kernels in present:
        for launch in kernels.get("launches", []):
            key = (launch["path"], launch["module"], launch.get("entry", ""), launch.get("source_sha256", ""),
                   launch.get("block", 0))
            counted.setdefault(key, {**launch, "count": 0})["count"] += launch["count"]
    merged["launches"] = [counted[key] for key in sorted(counted)]
    replays = [kernels["replay"] for kernels in present if kernels.get("replay")]
    if replays:
        merged["replay"] = {**replays[0], **{key: sum(replay[key] for replay in replays)
                                             for key in ("captures", "replayed_steps")}}
    return merged
