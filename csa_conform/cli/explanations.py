"""Explanations as the CLI shows them, shared by `explain` and `diff --explain`."""

from __future__ import annotations

from csa_conform.check.conformance import check_case
from csa_conform.check.model import CaseVerdict
from csa_conform.check.options import RunOptions
from csa_conform.cli.output import say_error
from csa_conform.explain import (
    AMBIGUOUS,
    EXPLAINED,
    FAILED,
    INHERITED,
    UNEXPLAINED,
    VERDICTS,
    Explanation,
    explain_report,
    settle_across_steps,
    structural_note,
)
from csa_conform.explain.device_libm import measured
from csa_conform.explain.patterns import stage_findings
from csa_conform.golden import GoldenFile
from csa_conform.spec import Mode


def explain_reports(golden: GoldenFile, reports: list[CaseVerdict], options: RunOptions,
                    stages: tuple[str, ...]) -> list[Explanation]:
    """Explanations of every case a diff run found divergent (what `diff --explain` adds).

    A chained diff's reports are the chained verdicts explain starts from; an
    isolated diff's cases are re-run chained first, so inherited divergences still show.
    """
    chained = options.runner(Mode.CHAINED) if options.mode is not Mode.CHAINED else None
    isolated = options.runner(Mode.ISOLATED)
    explanations = []
    for report in reports:
        if report.passed or report.invalid is not None or (report.fault is not None and not report.diverged()):
            continue  # a fault or hang has no numeric cause to find
        if chained is not None:
            report = check_case(golden, report.case, chained, stages, options.ulp, diagnose=stage_findings)
        explanations += explain_report(golden, report, isolated, stages, options.ulp, reports)
    settle_across_steps(explanations)  # the run's other cases of the same kernel are evidence too
    return explanations


def tally(explanations: list[Explanation]) -> dict[str, int]:
    """How many divergences each verdict got."""
    counts = {verdict: sum(e.verdict == verdict for e in explanations) for verdict in VERDICTS}
    structural = sum(explanation.structural is not None for explanation in explanations)
    return {"divergences": len(explanations), **counts, "structural": structural}


def tally_line(explanations: list[Explanation]) -> str:
    counts = tally(explanations)
    line = (f"{counts['divergences']} divergences: {counts[EXPLAINED]} explained, {counts[AMBIGUOUS]} ambiguous, "
            f"{counts[INHERITED]} inherited, {counts[UNEXPLAINED]} unexplained{structural_note(counts)}")
    return line + (f", {counts[FAILED]} whose explanation failed" if counts[FAILED] else "")


def say_failed(explanations: list[Explanation] | None) -> None:
    """One stderr line per explanation that failed inside csa-conform. A failure to explain is never the run's
    verdict: the exit code stays the diff's (1 for a divergence), the failed explanation says why in its own
    verdict, and every other explanation is kept."""
    for explanation in explanations or ():
        if explanation.verdict == FAILED:
            say_error(f"csa-conform: warning: explaining {explanation.case} step {explanation.step} "
                      f"{explanation.stage} failed: {explanation.note}")


def explanations_section(explanations: list[Explanation]) -> dict:
    """The results document's ``explain`` field (specs/results-document.md)."""
    return {"explain": {"summary": tally(explanations), "device_libm": measured(),
                        "explanations": [explanation.to_dict() for explanation in explanations]}}


def device_libm_lines() -> list[str]:
    """The device libm measured in the run, once (every case's hypotheses reused it)."""
    lines = []
    for entry in measured():
        functions = "; ".join(f"{name} rounds {counts['differing']:,} of {counts['arguments']:,} distinct arguments "
                              "otherwise than glibc" for name, counts in entry["functions"].items())
        lines.append(f"device libm ({entry['where']}; measured once, reused by every case): {functions}")
    return lines


def explanation_lines(explanations: list[Explanation]) -> list[str]:
    """Every divergence's explanation; one that only inherits another's (its isolated re-run is bit-exact,
    or its launch read what a divergent stage wrote) is folded into one line under its case's last own one."""
    lines = ["EXPLANATIONS", *device_libm_lines()] if explanations else []
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
