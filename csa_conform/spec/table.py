"""The stage payload table of specs/stage-payloads.md, generated from the stages (a test keeps them equal)."""

from __future__ import annotations

from csa_conform.spec.stages import PIPELINE, Role


def payload_table() -> str:
    """The markdown table, rows in pipeline order; writeback's row stands for every operator output."""
    lines = ["| stage | tensor | dtype | shape | meaning |", "|---|---|---|---|---|"]
    for stage in PIPELINE:
        for payload in stage.writes:
            lines.append(f"| {stage.name} | {payload.tensor} | {payload.dtype} | {payload.shape} | {payload.meaning} |")
        if stage.role is Role.WRITEBACK:
            lines.append(f"| {stage.name} | *every operator output* | as output | as output | "
                         "exactly what the operator returns |")
    return "\n".join(lines)
