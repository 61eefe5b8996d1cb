"""The statistics of a row: percentiles by hand, a bootstrap CI that is seeded, covers and narrows."""

from __future__ import annotations

import numpy as np
import pytest

from csa_conform.bench.stats import median_ci, ratio_ci, summarize


def test_summary_of_one_to_a_hundred_is_the_hand_computed_percentiles():
    summary = summarize(range(1, 101))
    assert summary.count == 100
    assert summary.median == 50.5
    # linear interpolation: the p-th percentile of 1..100 is 1 + 99 p
    assert summary.p10 == pytest.approx(10.9)
    assert summary.p90 == pytest.approx(90.1)
    assert summary.iqr == pytest.approx(75.25 - 25.75)
    assert summary.ci_low < 50.5 < summary.ci_high


def test_the_bootstrap_is_deterministic_and_covers_the_sample_median():
    values = np.random.default_rng(1).lognormal(0, 0.05, 57)
    assert median_ci(values) == median_ci(values.copy())
    low, high = median_ci(values)
    assert low <= np.median(values) <= high


def test_more_samples_narrow_the_interval():
    rng = np.random.default_rng(2)
    few = summarize(rng.normal(1.0, 0.01, 20))
    many = summarize(rng.normal(1.0, 0.01, 2000))
    assert many.noise < few.noise / 4


def test_the_interval_covers_the_true_median_about_95_percent_of_the_time():
    covered = 0
    for seed in range(200):
        values = np.random.default_rng(seed).normal(1.0, 0.01, 40)
        low, high = median_ci(values, resamples=500)
        covered += low <= 1.0 <= high
    assert 0.85 <= covered / 200 <= 0.99


def test_ratio_of_a_known_scaling_is_that_factor():
    base = np.random.default_rng(3).normal(1.0, 0.001, 50)
    ratio, low, high = ratio_ci(base * 1.25, base)
    assert ratio == pytest.approx(1.25)
    assert low <= 1.25 <= high


def test_no_samples_is_refused():
    with pytest.raises(ValueError):
        summarize([])
