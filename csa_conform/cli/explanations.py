"""Explanations as the CLI shows them, shared by `explain` and `diff --explain`."""

from __future__ import annotations

from csa_conform.check.conformance import CaseReport, check_case
from csa_conform.check.options import RunOptions
from csa_conform.explain import EXPLAINED, INHERITED, UNEXPLAINED, Explanation, explain_report
from csa_conform.explain.patterns import stage_findings
from csa_conform.golden import GoldenFile
from csa_conform.spec import Mode


def explain_reports(file: str, reports: list[CaseReport], options: RunOptions,
                    stages: tuple[str, ...]) -> list[Explanation]:
    """Explanations of every case a diff run found divergent (what `diff --explain` adds).

    A chained diff's reports are the chained verdicts explain starts from; an
    isolated diff's cases are re-run chained first, so inherited divergences still show.
    """
    chained = options.runner(Mode.CHAINED) if options.mode is not Mode.CHAINED else None
    isolated = options.runner(Mode.ISOLATED)
    explanations = []
    with GoldenFile(file) as golden:
        for report in reports:
            if report.passed:
                continue
            if chained is not None:
                report = check_case(golden, report.case, chained, stages, options.ulp, diagnose=stage_findings)
            explanations += explain_report(golden, report, isolated, stages, options.ulp)
    return explanations


def tally(explanations: list[Explanation]) -> dict[str, int]:
    """How many divergences each verdict got."""
    counts = {verdict: sum(e.verdict == verdict for e in explanations) for verdict in (EXPLAINED, INHERITED,
                                                                                        UNEXPLAINED)}
    return {"divergences": len(explanations), **counts}


def tally_line(explanations: list[Explanation]) -> str:
    counts = tally(explanations)
    return (f"{counts['divergences']} divergences: {counts[EXPLAINED]} explained, {counts[INHERITED]} inherited, "
            f"{counts[UNEXPLAINED]} unexplained")


def explanations_section(explanations: list[Explanation]) -> dict:
    """The results document's ``explain`` field (specs/results-document.md)."""
    return {"explain": {"summary": tally(explanations),
                        "explanations": [explanation.to_dict() for explanation in explanations]}}


def explanation_lines(explanations: list[Explanation]) -> list[str]:
    lines = ["EXPLANATIONS"] if explanations else []
    for explanation in explanations:
        lines.extend(explanation.lines())
    return lines + [tally_line(explanations)]
