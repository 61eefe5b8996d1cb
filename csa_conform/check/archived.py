"""Results documents read back, today's and every earlier release's, brought up to this schema.

CI systems archive results documents and merge shards from runners that
upgrade at different times, so ``report`` reads every document an earlier
csa-conform wrote, not only its own, and refuses only a newer version than
its own, saying so: a newer document's fields may mean what this one cannot
know. Version 1 (the seed's layout, 2026-11-29) is rebuilt as version 2 from
what it holds. Version 2 gained fields after its first release (2026-11-30)
without a version raise; a document written before a field existed lacks it,
and a fill gives it what the document itself implies (a count of its own
entries) or what the field says when nothing was recorded (null, an empty
list). specs/results-document.md, "Older documents", lists every step.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, fields
from typing import Callable

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from csa_conform._base import bounded_json
from csa_conform.check.results import (
    CORRUPT_DATASET,
    RESULTS_FORMAT,
    REJECTION_MISMATCH,
    RESULTS_VERSION,
    schema,
    tensor_entry,
)
from csa_conform.compare.bitwise import TensorDiff
from csa_conform.errors import UsageError

# What a build recorded before build profiles (2026-11-30): the one build there was, the strict one.
UNRECORDED_ORIGIN = "not recorded (a document written before build profiles, whose one build was strict)"


@dataclass(frozen=True)
class Fill:
    """One field version 2 gained after its first release, and how an older document gets it."""

    field: str  # where, as specs/results-document.md names it
    since: str  # the change that added it (date and commit)
    fill: Callable[[dict], None]


def _build(document: dict) -> None:
    """kernels.kernels.build and kernels.modules: before build profiles, the NVRTC options sat in
    kernels.nvrtc_options and no per-module record was kept."""
    kernels = document.get("kernels")
    if not isinstance(kernels, dict) or not isinstance(kernels.get("kernels"), dict):
        return
    if "provider" in kernels["kernels"]:  # a Python provider (since 2026-12-06) has no NVRTC build
        return
    options = kernels.pop("nvrtc_options", [])
    kernels["kernels"].setdefault("build", {"profile": "strict", "options": list(options), "origin": UNRECORDED_ORIGIN,
                                            "include_paths": [], "strict_ptx": False})
    kernels.setdefault("modules", {})


def _explanations(document: dict) -> None:
    """An explanation's kernel and structural diagnosis, before explain named either."""
    for explanation in (document.get("explain") or {}).get("explanations", []):
        explanation.setdefault("kernel", None)
        explanation.setdefault("diagnosis", [])


def _explain_summary(document: dict) -> None:
    """The ambiguous and failed counts: the explanations of those verdicts, which an older explain never gave."""
    explain = document.get("explain")
    if not isinstance(explain, dict) or not isinstance(explain.get("summary"), dict):
        return
    verdicts = [explanation.get("verdict") for explanation in explain.get("explanations", [])]
    for verdict in ("ambiguous", "failed"):
        explain["summary"].setdefault(verdict, verdicts.count(verdict))


def _bench(document: dict) -> None:
    """The timer's fallback (none: there was no CUPTI timer to fall back from), each row's repetition counts
    (not counted then: null), each device run's fallback and persisting-L2 policy (not recorded: null)."""
    bench = document.get("bench")
    if not isinstance(bench, dict):
        return
    bench.setdefault("timer_fallback", None)
    runs = (bench.get("devices") or {}).get("runs", [])
    for run in runs:
        run.setdefault("timer_fallback", None)
        run.setdefault("persisting_l2", None)
    for section in [bench] + runs:
        for case in section.get("cases", []):
            for row in case.get("rows", []):
                row.setdefault("repetitions", None)


FILLS = (
    Fill("kernels.kernels.build, kernels.modules", "2026-11-30, d58267d", _build),
    Fill("explain.explanations[].kernel, .diagnosis", "2026-12-01, 6f2070b", _explanations),
    Fill("explain.summary.ambiguous, .failed", "2026-12-02, dd38e20", _explain_summary),
    Fill("bench.timer_fallback, bench.cases[].rows[].repetitions, bench.devices.runs[].timer_fallback, "
         ".persisting_l2", "2026-12-02, 7adb626 c5b3866 05fbeeb", _bench),
)


NOT_RECORDED = "not recorded (results version 1)"
_DIFF_FIELDS = {item.name for item in fields(TensorDiff)}


def from_version_1(document: dict) -> dict:
    """A version-1 document (the seed's: ``file``, ``argv`` as one string, every step listed with its
    ``diffs``) as version 2 writes the same run: its failing steps only, each failure typed, its tensors
    as today's entries (their fields are the same comparison's); what version 1 never recorded (the
    tool's version, the golden file's digest, the kernels, the options, the times) is null, empty or
    zero, and the exit code is the one its verdict implies."""
    cases = [_case_from_version_1(case) for case in document.get("cases", [])]
    summary = document.get("summary", {})
    return {
        "format": RESULTS_FORMAT, "version": 2,
        "tool": {"name": "csa-conform", "version": NOT_RECORDED, "oracle_version": NOT_RECORDED},
        "command": document.get("command"), "argv": shlex.split(str(document.get("argv", ""))),
        "golden": {"path": str(document.get("file")), "sha256": None, "schema_version": None},
        "kernels": None, "control_run": None, "options": {},
        "passed": document.get("passed"), "exit_code": 0 if document.get("passed") else 1,
        "summary": {**summary, "time_s": 0.0},
        "cases": cases,
    }


def _case_from_version_1(case: dict) -> dict:
    reproduce = case.get("reproduce", "")
    steps = case.get("steps", [])
    entry = {
        "case": case.get("case_id"), "family": case.get("family", ""), "passed": case.get("passed"),
        "time_s": 0.0, "steps_total": len(steps),
        "steps_compared": sum(1 for step in steps if step.get("compared")), "reproduce": reproduce,
        "rejected_steps": [step["step"] for step in steps if step.get("expect_error") is not None],
        "steps": [_step_from_version_1(step, reproduce) for step in steps if not step.get("passed")],
    }
    if case.get("problem"):
        entry["failure"] = {"type": CORRUPT_DATASET, "message": case["problem"], "reproduce": reproduce}
    return entry


def _step_from_version_1(step: dict, reproduce: str) -> dict:
    stages: dict[str, list[dict]] = {}
    for diff in step.get("diffs", []):
        known = {key: value for key, value in diff.items() if key in _DIFF_FIELDS}
        known["shape"], known["axes"] = tuple(known.get("shape", ())), tuple(known.get("axes", ()))
        stages.setdefault(diff["stage"], []).append(tensor_entry(TensorDiff(**known)))
    entry = {"step": step["step"], "stages": [{"stage": stage, "reproduce": reproduce, "tensors": tensors}
                                              for stage, tensors in stages.items()]}
    if step.get("problem"):
        entry["failure"] = {"type": REJECTION_MISMATCH, "message": step["problem"], "reproduce": reproduce}
    return entry


def migrated(document: dict) -> dict:
    """``document`` (version 1 or 2, any release) as this version writes it: version 1 rebuilt, then every
    field of version 2 it predates filled; a document that has them all comes back unchanged."""
    if document.get("version") == 1:
        document = from_version_1(document)
    for fill in FILLS:
        fill.fill(document)
    return document


def load_results(text: str, origin: str) -> dict:
    """A results document read back (the input of ``csa-conform report``), migrated and checked enough to
    render it."""
    document = bounded_json.loads(text, origin)
    if not isinstance(document, dict) or document.get("format") != RESULTS_FORMAT:
        raise UsageError(f"{origin}: not a csa-conform results document (write one with --json)")
    version = document.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise UsageError(f"{origin}: results version {version!r} is no version a csa-conform wrote "
                         f"(they are 1 to {RESULTS_VERSION})")
    if version > RESULTS_VERSION:
        raise UsageError(f"{origin}: results version {version} was written by a newer csa-conform; this one "
                         f"reads versions 1 to {RESULTS_VERSION}: report it with that csa-conform or a later one")
    document = migrated(document)
    problem = best_match(Draft202012Validator(schema()).iter_errors(document))
    if problem is not None:
        where = "/".join(str(part) for part in problem.absolute_path) or "the document"
        raise UsageError(f"{origin}: {where}: {problem.message} (not a results document a csa-conform wrote)")
    summary, cases = document["summary"], document["cases"]
    if summary["cases"] != len(cases) or summary["failed"] != sum(not case["passed"] for case in cases):
        raise UsageError(f"{origin}: summary does not count the cases it lists (edited by hand?)")
    return document
