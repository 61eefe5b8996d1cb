"""One hypothesis re-run and what it showed: how far its payload is from the device's, what it changed."""

from __future__ import annotations

from dataclasses import dataclass, field


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

    @property
    def reproduces(self) -> bool:
        return self.rejected is None and self.mismatches == 0

    def effect(self) -> str:
        """'15 of 39,168 expf arguments round differently' and the like."""
        parts = []
        for what, (changed, seen) in self.changed.items():
            if what == "subnormal":
                parts.append(f"{changed:,} of {seen:,} binary32 inputs and results are subnormal and flush to zero")
                continue
            unit = "operations" if what.startswith("fused") else "arguments"
            parts.append(f"{changed:,} of {seen:,} {what} {unit} round differently")
        return "; ".join(parts) or "changes no argument"

    def to_dict(self) -> dict:
        return {"key": self.key, "name": self.name, "mismatches": self.mismatches, "elements": self.elements,
                "reproduces": self.reproduces, "rejected": self.rejected,
                "changed": {what: {"changed": c, "seen": s} for what, (c, s) in self.changed.items()}}
