"""`explain`: the cause of every divergence a device run shows.

The package: the verdict (csa_conform.explain.verdict), the entry points
(entry: explain_step of a Divergence, explain_report, explain_case(s), settle_across_steps), the structural
pre-checks (structural), the numeric search and its caps (search), the
device libm probe (device_libm), the hypotheses (hypotheses) and their
re-runs (rows, stages, trial), and the first element's provenance (element).
specs/diagnosis.md says how a verdict is reached and how strong its evidence is.
"""

from csa_conform.explain.entry import (
    Divergence,
    explain_case,
    explain_cases,
    explain_report,
    explain_step,
    settle_across_steps,
)
from csa_conform.explain.trial import Trial
from csa_conform.explain.verdict import (
    AMBIGUOUS,
    EXPLAINED,
    FAILED,
    INHERITED,
    UNEXPLAINED,
    VERDICTS,
    Explanation,
    structural_note,
)

__all__ = ["AMBIGUOUS", "EXPLAINED", "FAILED", "INHERITED", "UNEXPLAINED", "VERDICTS", "Divergence", "Explanation",
           "Trial",
           "explain_case", "explain_cases", "explain_report", "explain_step", "settle_across_steps", "structural_note"]
