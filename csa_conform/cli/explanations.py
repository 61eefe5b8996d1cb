"""Explanations as the CLI shows them, shared by `explain` and `diff --explain`."""

from __future__ import annotations

from csa_conform.device.conformance import CaseReport
from csa_conform.device.kernels import KernelDirectory
from csa_conform.explain import EXPLAINED, INHERITED, UNEXPLAINED, Explanation, explain_case
from csa_conform.goldens import GoldenFile


def explain_reports(file: str, reports: list[CaseReport], kernels: KernelDirectory, force_host: frozenset[str],
                    stages: tuple[str, ...], ulp: int) -> list[Explanation]:
    """Explanations of every case a diff run found divergent (what `diff --explain` adds)."""
    with GoldenFile(file) as golden:
        return [explanation for report in reports if not report.passed
                for explanation in explain_case(golden, report.case, kernels, force_host, stages, ulp)]


def tally(explanations: list[Explanation]) -> str:
    counts = {verdict: sum(e.verdict == verdict for e in explanations) for verdict in (EXPLAINED, INHERITED,
                                                                                        UNEXPLAINED)}
    return (f"{len(explanations)} divergences: {counts[EXPLAINED]} explained, {counts[INHERITED]} inherited, "
            f"{counts[UNEXPLAINED]} unexplained")


def explanation_lines(explanations: list[Explanation]) -> list[str]:
    lines = ["EXPLANATIONS"] if explanations else []
    for explanation in explanations:
        lines.extend(explanation.lines())
    return lines + [tally(explanations)]
