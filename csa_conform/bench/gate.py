"""The regression gate: is a row of the new kernels slower than the same row of the baseline?

A change is called only when the 95% CI of median(new) / median(base) lies
wholly beyond 1 ± max(3%, 2 × noise), noise being the larger relative
half-width of the two medians' CIs, so a run whose own medians wobble by 2%
needs a 4% gap, and a gap under twice the timer's resolution (CUDA events:
about 0.5 us; CUPTI: 32 ns, its GPU clock's tick) is no change however narrow the interval. SLOW must also hold in cycles (each sample's time times the
SM clock it ran at, where the clock was read), so a clock that moved between
the runs is not a regression, and must recur when the row is measured again
(``confirm``). FAST is the mirror image and is reported, never fatal. SAME
is a CI inside the band; anything else (a CI across a band edge, time and
cycles that disagree, a SLOW that did not recur, fewer than MIN_JUDGED samples
on a side) is AMBG, which fails a run only under ``--strict``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from csa_conform.bench.stats import ratio_ci, summarize

SLOW, FAST, SAME, AMBG = "SLOW", "FAST", "SAME", "AMBG"
VERDICTS = (SLOW, FAST, SAME, AMBG)
MIN_CHANGE = 0.03
NOISE_FACTOR = 2.0
MIN_JUDGED = 5  # fewer samples on a side make a point-like interval, no evidence of a change


@dataclass(frozen=True)
class Judgement:
    """One row's verdict and the numbers it rests on."""

    verdict: str
    ratio: float
    ci_low: float
    ci_high: float
    threshold: float
    cycles: tuple[float, float, float] | None  # (ratio, CI low, CI high) in cycles; None without clocks
    reason: str
    reruns: int = 0

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "ratio": self.ratio, "ci": [self.ci_low, self.ci_high],
                "threshold": self.threshold,
                "cycles": None if self.cycles is None else {"ratio": self.cycles[0], "ci": list(self.cycles[1:])},
                "reason": self.reason, "reruns": self.reruns}


def threshold(new: Sequence[float], base: Sequence[float]) -> float:
    """max(3%, 2 × the larger relative CI half-width of the two medians)."""
    return max(MIN_CHANGE, NOISE_FACTOR * max(summarize(new).noise, summarize(base).noise))


def _side(low: float, high: float, band: float) -> str:
    if low > 1 + band:
        return SLOW
    if high < 1 - band:
        return FAST
    if low >= 1 - band and high <= 1 + band:
        return SAME
    return AMBG


def compare(new: Sequence[float], base: Sequence[float], new_cycles: Sequence[float] | None = None,
            base_cycles: Sequence[float] | None = None, resolution: float = 0.0) -> Judgement:
    """The verdict of one measurement of both sides (times in seconds; cycles where both sides have clocks;
    ``resolution``: the timer's, in seconds)."""
    band = threshold(new, base)
    ratio, low, high = ratio_ci(new, base)
    if min(len(new), len(base)) < MIN_JUDGED:
        return Judgement(AMBG, ratio, low, high, band, None,
                         f"new/base {ratio:.4f} from {len(new)} and {len(base)} samples: too few to judge")
    verdict = _side(low, high, band)
    cycles = ratio_ci(new_cycles, base_cycles) if new_cycles is not None and base_cycles is not None else None
    band_text = f"±{band:.1%}"
    reason = f"new/base {ratio:.4f}, CI [{low:.4f}, {high:.4f}] against 1{band_text}"
    gap = abs(float(np.median(new)) - float(np.median(base)))
    if verdict in (SLOW, FAST) and gap < 2 * resolution:
        return Judgement(SAME, ratio, low, high, band, cycles,
                         reason + f"; the medians differ by {gap * 1e6:.2f} us, under twice the timer's resolution")
    if verdict in (SLOW, FAST) and cycles is not None and _side(cycles[1], cycles[2], band) != verdict:
        return Judgement(AMBG, ratio, low, high, band, cycles,
                         reason + f"; in cycles CI [{cycles[1]:.4f}, {cycles[2]:.4f}]: the clock explains the gap")
    return Judgement(verdict, ratio, low, high, band, cycles, reason)


def confirm(first: Judgement, again: Judgement) -> Judgement:
    """A SLOW stands only when the re-run is SLOW too; otherwise the row is AMBG."""
    if first.verdict != SLOW:
        return first
    if again.verdict == SLOW:
        return Judgement(SLOW, again.ratio, again.ci_low, again.ci_high, again.threshold, again.cycles,
                         f"{first.reason}; recurred on the re-run: {again.reason}", first.reruns + 1)
    return Judgement(AMBG, again.ratio, again.ci_low, again.ci_high, again.threshold, again.cycles,
                     f"{first.reason}; did not recur on the re-run ({again.verdict}: {again.reason})",
                     first.reruns + 1)
