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
            if report.passed or report.invalid is not None:
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
    """Every divergence's explanation; one that only inherits another's (its isolated re-run is bit-exact,
    or its launch read what a divergent stage wrote) is folded into one line under its case's last own one."""
    lines = ["EXPLANATIONS"] if explanations else []
    cases: dict[str, list[Explanation]] = {}
    for explanation in explanations:
        cases.setdefault(explanation.case, []).append(explanation)
    for found in cases.values():
        own = [explanation for explanation in found if explanation.verdict != INHERITED]
        for explanation in own or found:
            lines.extend(explanation.lines())
        inherited = [explanation for explanation in found if explanation.verdict == INHERITED] if own else []
        if inherited:
            where = ", ".join(f"{explanation.stage} step {explanation.step}" for explanation in inherited)
            lines.append(f"  {len(inherited)} inherited (no cause of their own; the case's headline above is "
                         f"theirs): {where}")
    return lines + [tally_line(explanations)]
