"""Claims: every sentence of an explanation's headline, with what established it.

A claim is either a fact about the bytes (``observation``: which elements
differ, what the reference and the device hold there) or the result of an
experiment: the reference's payload under a transform that is the device's
bit for bit (``transform``), the stage re-run with one thing done another
way that reproduces the device bit for bit (``re-run``), an intermediate
observed on the device (``probe``), or the divergence vanishing or
persisting with one input neutralised (``ablation``). What only fits within
rounding bounds (``fit``) says which sub-steps the bytes are *consistent*
with and never names one. The confidence word follows from the source and
its support (specs/diagnosis.md, "Evidence strength"): ``strong`` only from
an experiment.
"""

from __future__ import annotations

from dataclasses import dataclass, field

OBSERVATION = "observation"
TRANSFORM = "transform"
RERUN = "re-run"
PROBE = "probe"
ABLATION = "ablation"
FIT = "fit"
SOURCES = (OBSERVATION, TRANSFORM, RERUN, PROBE, ABLATION, FIT)
EXPERIMENTS = frozenset({TRANSFORM, RERUN, PROBE, ABLATION})

STRONG = 8  # support of an experiment from which it is "strong"
MODERATE = 2  # support from which a claim is "moderate"; fewer: "weak"
OBSERVED = "observed"  # the confidence word of a fact about the bytes: nothing is inferred


def confidence_of(support: int, source: str = RERUN) -> str:
    """The documented word for a claim of ``source`` resting on ``support`` independent elements or arguments."""
    if source == OBSERVATION:
        return OBSERVED
    if support >= STRONG and source in EXPERIMENTS:
        return "strong"
    return "moderate" if support >= MODERATE else "weak"


@dataclass(frozen=True)
class Claim:
    """One sentence of a headline and its source: ``support`` counts the independent elements (or changed
    arguments) it rests on; ``detail`` is the source's own record (a trial key, a probe's name and element
    diff, an ablation's list of (what was neutralised, divergent or not))."""

    text: str
    source: str
    support: int = 0
    detail: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"unknown claim source {self.source!r}")

    @property
    def confidence(self) -> str:
        return confidence_of(self.support, self.source)

    def to_dict(self) -> dict:
        return {"text": self.text, "source": self.source, "support": self.support, "confidence": self.confidence,
                "detail": self.detail}
