"""Row-ordered failures for the ratio-4 selection path.

The reference finalizes index queries, scores and checks ties one query row
(b, s) at a time, so a failure in an early row wins over any later row's,
whichever stage the later failure belongs to. Stages report their first
failing flattened row (b * S + s) and the pipeline raises the earliest.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class RowFailure:
    row: int
    stage_rank: int
    message: str
    kind: str = "invalid"


def earliest(*failures: RowFailure | None) -> RowFailure | None:
    present = [failure for failure in failures if failure is not None]
    return min(present) if present else None
