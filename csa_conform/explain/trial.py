"""One hypothesis re-run and what it showed: how far its payload is from the device's, what it changed,
and how much evidence a reproduction stands on (specs/diagnosis.md, "Evidence strength")."""

from __future__ import annotations

from dataclasses import dataclass, field

from csa_conform.explain.claims import confidence_of
from csa_conform.numerics.variant import LOGIT_SUM, VALUE_SUM


@dataclass
class Trial:
    """One hypothesis re-run: how far its payload is from the device's, and what its swap changed."""

    key: str
    name: str
    mismatches: int
    elements: int
    changed: dict[str, tuple[int, int]] = field(default_factory=dict)
    rejected: str | None = None
    digest: str = ""  # of the re-run's payload bytes: two trials with one digest computed the same payload
    reproduced: int = 0  # the device's differing elements (from the reference) this re-run's payload matches

    # A reproduction's support: the independent arguments its swap changed (or, for a re-run whose swap
    # counts none, the device's differing elements it reproduces); the confidence word follows from it.

    @property
    def reproduces(self) -> bool:
        return self.rejected is None and self.mismatches == 0

    @property
    def support(self) -> int:
        """Independent evidence: the arguments (operations) the swap changed, else the elements it reproduced."""
        changed = sum(count for count, _ in self.changed.values())
        return changed if changed else self.reproduced

    @property
    def confidence(self) -> str:
        return confidence_of(self.support)

    def strength(self) -> str:
        unit = "changed argument" if any(count for count, _ in self.changed.values()) else "reproduced element"
        return f"{self.confidence}: {self.support:,} {unit}{'s' if self.support != 1 else ''}"

    def effect(self) -> str:
        """'15 of 39,168 expf arguments round differently' and the like."""
        parts = []
        for what, (changed, seen) in self.changed.items():
            if what == "subnormal":
                parts.append(f"{changed:,} of {seen:,} binary32 inputs and results are subnormal and flush to zero")
                continue
            unit = ("operations" if what.startswith("fused") else "elements" if what in (VALUE_SUM, LOGIT_SUM)
                    else "arguments")
            parts.append(f"{changed:,} of {seen:,} {what} {unit} round differently")
        if parts:
            return "; ".join(parts)
        if not self.reproduced:
            return "changes no argument"
        return f"{self.reproduced:,} differing element{'s' if self.reproduced != 1 else ''} reproduced"

    def to_dict(self) -> dict:
        return {"key": self.key, "name": self.name, "mismatches": self.mismatches, "elements": self.elements,
                "reproduces": self.reproduces, "rejected": self.rejected,
                "changed": {what: {"changed": c, "seen": s} for what, (c, s) in self.changed.items()},
                "support": self.support, "confidence": self.confidence}
