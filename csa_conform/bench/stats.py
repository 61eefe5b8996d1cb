"""The statistics of one row's samples: median, spread, and a bootstrap confidence interval of the median.

Kernel times are skewed (a launch is never faster than its floor, sometimes
much slower), so the centre is the median and its uncertainty a percentile
bootstrap: resample the samples with replacement, take each resample's
median, read the 2.5th and 97.5th percentiles. The generator is seeded, so
the same samples always give the same interval (a gate must not flip on a
re-read of one file).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

SEED = 20261202
RESAMPLES = 2000
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Summary:
    """What a row's samples say: count, median, IQR, p10/p90 and the CI of the median (all in seconds)."""

    count: int
    median: float
    iqr: float
    p10: float
    p90: float
    ci_low: float
    ci_high: float

    @property
    def noise(self) -> float:
        """Half the CI's width relative to the median: how far the median itself can be trusted."""
        return (self.ci_high - self.ci_low) / 2 / self.median if self.median > 0 else float("inf")

    def to_dict(self) -> dict:
        return {**asdict(self), "noise": self.noise}


def _interval(statistics: np.ndarray) -> tuple[float, float]:
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(statistics, [tail, 100 - tail])
    return float(low), float(high)


def bootstrap_medians(values: np.ndarray, rng: np.random.Generator, resamples: int) -> np.ndarray:
    """The medians of ``resamples`` resamples of ``values`` with replacement (np.median's, by a sort:
    several times faster than its partition on short rows)."""
    count = values.size
    ordered = np.sort(values[rng.integers(0, count, size=(resamples, count))], axis=1)
    middle = count // 2
    return ordered[:, middle] if count % 2 else (ordered[:, middle - 1] + ordered[:, middle]) / 2


def median_ci(values: Sequence[float], resamples: int = RESAMPLES, seed: int = SEED) -> tuple[float, float]:
    """The bootstrap 95% CI of the median of ``values`` (deterministic for given values)."""
    array = np.asarray(values, dtype=np.float64)
    return _interval(bootstrap_medians(array, np.random.default_rng(seed), resamples))


def summarize(values: Sequence[float], resamples: int = RESAMPLES) -> Summary:
    """Summary of at least one sample."""
    array = np.asarray(values, dtype=np.float64)
    if array.size == 0:
        raise ValueError("no samples to summarize")
    p10, q1, median, q3, p90 = np.percentile(array, [10, 25, 50, 75, 90])
    low, high = median_ci(array, resamples)
    return Summary(int(array.size), float(median), float(q3 - q1), float(p10), float(p90), low, high)


def ratio_ci(new: Sequence[float], base: Sequence[float], resamples: int = RESAMPLES,
             seed: int = SEED) -> tuple[float, float, float]:
    """median(new) / median(base) and the bootstrap 95% CI of that ratio (both sides resampled independently)."""
    new_array = np.asarray(new, dtype=np.float64)
    base_array = np.asarray(base, dtype=np.float64)
    rng = np.random.default_rng(seed)
    ratios = bootstrap_medians(new_array, rng, resamples) / bootstrap_medians(base_array, rng, resamples)
    low, high = _interval(ratios)
    return float(np.median(new_array) / np.median(base_array)), low, high
