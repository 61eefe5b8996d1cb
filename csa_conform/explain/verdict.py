"""The verdict on one divergent (case, step, stage): what explain found, and how it says it.

A verdict is ``explained`` (one ingredient, or one set of indistinguishable
variants of it, reproduces the device bit for bit), ``ambiguous`` (rival
hypotheses of different ingredients each reproduce it and no experiment
separated them: all are named, none is chosen), ``inherited``,
``unexplained``, or ``failed`` (csa-conform itself failed while explaining:
the divergence stays reported, the error is named as the tool's).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from csa_conform.explain.ablation import ablation_text
from csa_conform.explain.claims import RERUN, Claim
from csa_conform.explain.patterns import STRUCTURAL, Finding
from csa_conform.explain.probes import defect_text, probe_text
from csa_conform.explain.trial import Trial

EXPLAINED = "explained"
AMBIGUOUS = "ambiguous"
UNEXPLAINED = "unexplained"
INHERITED = "inherited"
FAILED = "failed"
VERDICTS = (EXPLAINED, AMBIGUOUS, INHERITED, UNEXPLAINED, FAILED)


@dataclass
class Explanation:
    """The verdict on one divergent (case, step, stage)."""

    case: str
    step: int
    stage: str
    verdict: str
    summary: list[str] = field(default_factory=list)
    cause: Trial | None = None
    closest: Trial | None = None
    trials: list[Trial] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    first: dict | None = None
    note: str = ""
    diagnosis: list[Finding] = field(default_factory=list)
    kernel: str | None = None
    baseline: int = 0  # elements that differ under the reference's own arithmetic
    search: dict | None = None  # how the numeric search ran: singles, combinations, the cap and whether it was hit
    rivals: list[Trial] = field(default_factory=list)  # every reproducing hypothesis (explained: the cause's variants)
    experiments: list[dict] = field(default_factory=list)  # conformant cases the rivals were re-run on
    refuted: dict[str, dict] = field(default_factory=dict)  # hypothesis key -> the experiment that refuted it
    # what else the headline states: observations (value classes), probe and ablation results
    claims: list[Claim] = field(default_factory=list)
    values: list[str] = field(default_factory=list)  # value classes no one pair covers, as counts (detail lines)
    probe: dict | None = None  # the sub-step probes of a case's first divergent step (csa_conform.explain.probes)
    ablations: list[dict] = field(default_factory=list)  # its input ablations (csa_conform.explain.ablation)
    # the reproducing hypotheses by key, for the experiments that follow the verdict (not part of the document)
    hypotheses: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def confidence(self) -> str | None:
        """The documented confidence word of the verdict's claim (specs/diagnosis.md), None without one."""
        if self.verdict == EXPLAINED and self.cause is not None:
            return self.cause.confidence
        if self.verdict == AMBIGUOUS:
            return AMBIGUOUS
        finding = self.diagnosis[0] if self.diagnosis else None
        return finding.confidence if finding is not None else None

    def headline(self) -> str:
        """The lead claim, then every other claim (observations of the values, probes, ablations)."""
        lead = self._lead()
        if self.verdict in (FAILED, INHERITED) or not self.claims:
            return lead
        return lead + "; " + "; ".join(claim.text for claim in self.claims)

    def lead_claim(self) -> Claim | None:
        """The headline's first claim with its source: a re-run's cause, a finding, or None (no claim made)."""
        if self.verdict in (EXPLAINED, AMBIGUOUS) and (self.cause or self.rivals):
            trial = self.cause or min(self.rivals, key=lambda rival: rival.support)
            return Claim(self._lead().split(": ", 1)[1], RERUN, trial.support, {"trial": trial.key})
        finding = self.diagnosis[0] if self.diagnosis else None
        if self.verdict == UNEXPLAINED and finding is not None:
            return Claim(finding.headline, finding.established_by, finding.support, {"kind": finding.kind})
        return None

    def _lead(self) -> str:
        where = f"{self.case} step {self.step} {self.stage}"
        if self.kernel:
            where += f" [{self.kernel}]"
        if self.verdict == FAILED:
            return f"{where}: explanation failed: {self.note}"
        if self.verdict == EXPLAINED and self.cause is not None:
            also = [trial.name for trial in self.rivals if trial.key != self.cause.key]
            same = f" (equally: {'; '.join(also)}: the same values on every argument seen)" if also else ""
            return (f"{where}: explained: {self.cause.name}{same} — {self.cause.effect()}; "
                    f"reproduces {self.tensors()} bit for bit ({self.cause.strength()}){self.experiment_text()}")
        if self.verdict == AMBIGUOUS:
            names = " or ".join(trial.name for trial in self.rivals)
            ablated = sum(bool(e.get("ablation")) for e in self.experiments)
            steps = len(self.experiments) - ablated
            done = [f"{steps} experiment{'s' if steps != 1 else ''} on steps of this kernel"] if steps else []
            done += [f"{ablated} ablated variant{'s' if ablated != 1 else ''} of this step"] if ablated else []
            separated = f"{' and '.join(done)} separated none of them" if done else "no experiment separated them"
            return (f"{where}: ambiguous: {names} — each reproduces {self.tensors()} bit for bit "
                    f"({'; '.join(f'{trial.name}: {trial.effect()}' for trial in self.rivals)}); {separated}")
        if self.verdict == INHERITED:
            return f"{where}: inherited: {self.note}"
        finding = self.structural
        if finding is not None:
            return (f"{where}: {finding.kind}: {finding.headline} (structural, {finding.confidence}: no numeric "
                    "ingredient tried)")
        finding = self.diagnosis[0] if self.diagnosis else None
        pattern = f": {finding.kind}: {finding.headline}" if finding is not None else (
            f": {self.note}" if self.note else "")
        return f"{where}: unexplained{pattern} ({self.closest_text()})"

    @property
    def structural(self) -> Finding | None:
        """The decisive structural finding that names an unexplained divergence (what the kernel did wrong, which
        no numeric ingredient makes, so none was tried), or None."""
        finding = self.diagnosis[0] if self.diagnosis else None
        if (self.verdict == UNEXPLAINED and finding is not None and finding.kind in STRUCTURAL and finding.decisive
                and finding.evidence.get("structural", True) and self.search is None):
            return finding
        return None

    def ablated_agreeing(self, key: str) -> list[dict]:
        """The ablated variants of this step on which the re-run ``key`` predicts the device's bytes."""
        return [e for e in self.experiments if e.get("ablation") and e["unlike_device"].get(key) == 0]

    def experiment_text(self) -> str:
        """What the experiments showed: the rivals they refuted (on a conformant step, or on a divergent step of
        the same kernel that another rival reproduces), the conformant steps that agree, and the ablated variants
        of this step whose device bytes the cause's re-run predicts."""
        parts = []
        for key, e in self.refuted.items():
            if e.get("ablation"):  # its own claim says which input refuted it
                continue
            if e["device_differing"]:
                parts.append(f"{key} refuted on {e['case']} step {e['step']}, a divergent step of this kernel that "
                             f"a rival reproduces: its re-run leaves {e['unlike_device'][key]:,} elements unlike the "
                             "device's")
            else:
                parts.append(f"{key} refuted on {e['case']} step {e['step']}: it predicts "
                             f"{e['predicted_differing'][key]:,} differing elements, the device's bytes are the "
                             "reference's")
        steps = sum(not e["device_differing"] and not e.get("ablation") for e in self.experiments)
        if steps:
            parts.append(f"the device agrees with it on {steps} conformant step{'s' if steps != 1 else ''} of this "
                         "kernel")
        ablated = len(self.ablated_agreeing(self.cause.key)) if self.cause is not None else 0
        if ablated:
            parts.append(f"its re-run predicts the device's bytes on {ablated} ablated variant"
                         f"{'s' if ablated != 1 else ''} of this step too")
        return "".join(f"; {part}" for part in parts)

    def closest_text(self) -> str:
        if self.closest is not None:
            return (f"closest: {self.closest.name} reduces the differing elements from {self.baseline:,} to "
                    f"{self.closest.mismatches:,} of {self.closest.elements:,}")
        if self.search is not None and not self.search["singles"]:  # an integer stage: only its steps re-run
            return "no numeric ingredient applies to this stage"
        if self.search is None and not self.trials:
            return "no numeric ingredient tried"
        if any(trial.rejected is None for trial in self.trials):
            return "no numeric ingredient moves the result"
        return "no numeric ingredient applies to this stage"

    def tensors(self) -> str:
        return ", ".join(line.split(":", 1)[0].split("/", 1)[-1] for line in self.summary) or "the payload"

    def lines(self) -> list[str]:
        lines = [self.headline()]
        lines.extend(f"  {line}" for line in self.summary)
        if self.probe is not None:
            lines.append(f"  {probe_text(self.probe)}")
            lines.extend(f"  {line}" for line in defect_text(self.probe))
        lines.extend(f"  {line}" for line in ablation_text(self.ablations))
        for finding in self.diagnosis[1:]:
            lines.append(f"  also {finding.kind}: {finding.headline}")
        lines.extend(f"  values: {line}" for line in self.values)
        for key, reason in self.skipped.items():
            lines.append(f"  skipped {key}: {reason}")
        if self.search and self.search["capped"]:
            lines.append(f"  combination search stopped at its cap of {self.search['cap']} combinations "
                         f"({self.search['untried']:,} more not tried)")
        if self.first:
            lines.append("  first divergent element: " + _describe(self.first))
        return lines

    def to_dict(self) -> dict:
        return {"case": self.case, "step": self.step, "stage": self.stage, "verdict": self.verdict,
                "headline": self.headline(), "divergence": self.summary, "note": self.note,
                "cause": None if self.cause is None else self.cause.to_dict(),
                "closest": None if self.closest is None else self.closest.to_dict(),
                "rivals": [trial.to_dict() for trial in self.rivals], "confidence": self.confidence,
                "experiments": self.experiments, "refuted": sorted(self.refuted),
                "trials": [trial.to_dict() for trial in self.trials], "skipped": self.skipped,
                "first_element": self.first, "kernel": self.kernel, "baseline": self.baseline,
                "search": self.search, "diagnosis": [finding.to_dict() for finding in self.diagnosis],
                "claims": [claim.to_dict() for claim in filter(None, [self.lead_claim(), *self.claims])],
                "values": self.values, "probe": self.probe, "ablations": self.ablations}


def _value(value) -> str:
    """binary32 values as their shortest binary32 repr, everything else as is."""
    return str(np.float32(value)) if isinstance(value, float) else str(value)


def _describe(first: dict) -> str:
    parts = []
    for key, value in first.items():
        if key == "candidates":
            value = "; ".join(f"{c['kind']} {c['id']} score {_value(c['score'])} weight {_value(c['weight'])}"
                              for c in value)
            parts.append(f"top candidates [{value}]")
        elif key == "block":
            parts.append("block " + ", ".join(f"{k} {_value(v)}" for k, v in value.items()))
        else:
            parts.append(f"{key} {_value(value)}")
    return "; ".join(parts)


def structural_note(counts: dict) -> str:
    """How many unexplained divergences a structural finding names (what was done wrong, not a numeric cause)."""
    structural = counts.get("structural", 0)
    return f" ({structural} of them named by a structural finding)" if structural else ""
