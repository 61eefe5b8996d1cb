"""What a depth mode of diff finds besides the bits (--repeat, --replay, --invariance): one typed record.

The device modes return their own records (csa_conform.device.determinism,
csa_conform.device.replay), the invariance check builds its own; a case's
verdict holds them all as ``RunFinding``, and ``failure`` is the entry
the results document records under its step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from csa_conform.check.results import Failure


@dataclass(frozen=True)
class RunFinding:
    """One finding at one step: its status (``kind``), its message, and the details the document records
    between them (``stages`` among them, in the order the finding's own record gives)."""

    kind: str
    step: int
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of_device(cls, finding, step: int) -> RunFinding:
        """A device mode's record (Nondeterminism, ReplayMismatch) at ``step``."""
        return cls(finding.kind, step, finding.message, finding.to_dict())

    @property
    def stages(self) -> tuple[str, ...]:
        """The stages the finding touches, the one it is reproduced under first."""
        return tuple(self.details["stages"])

    def failure(self, reproduce: str) -> Failure:
        """The finding as its step's entry in the results document records it, with its reproduce command."""
        return Failure(self.kind, self.message, reproduce, dict(self.details))
