"""The regression gate on synthetic samples: identical runs, small and large changes, bimodal samples,
clocks that explain a gap, and a SLOW that must recur."""

from __future__ import annotations

import numpy as np
import pytest

from csa_conform.bench.gate import AMBG, FAST, MIN_CHANGE, MIN_JUDGED, SAME, SLOW, compare, confirm, threshold


def _run(rng, scale: float = 1.0, noise: float = 0.005, count: int = 40) -> np.ndarray:
    return scale * 1e-4 * rng.lognormal(0.0, noise, count)


@pytest.mark.parametrize("noise", [0.002, 0.005, 0.02, 0.1])
def test_identical_runs_are_never_slow(noise):
    for seed in range(60):
        rng = np.random.default_rng(seed)
        verdict = compare(_run(rng, noise=noise, count=20 + seed % 40), _run(rng, noise=noise)).verdict
        assert verdict != SLOW, seed


def test_identical_quiet_runs_are_same():
    verdicts = [compare(_run(np.random.default_rng(seed)), _run(np.random.default_rng(seed + 1000))).verdict
                for seed in range(60)]
    assert verdicts.count(SAME) >= 57


def test_bimodal_identical_runs_are_never_slow():
    for seed in range(60):
        rng = np.random.default_rng(seed)

        def bimodal():
            return np.where(rng.random(41) < 0.5, 1.0, 1.3) * rng.lognormal(0, 0.003, 41)

        assert compare(bimodal(), bimodal()).verdict != SLOW, seed


def test_bimodal_samples_widen_the_band():
    rng = np.random.default_rng(7)
    bimodal = np.where(rng.random(40) < 0.5, 1.0, 1.3)
    quiet = rng.lognormal(0, 0.002, 40)
    assert threshold(bimodal, bimodal) > threshold(quiet, quiet) == MIN_CHANGE


def test_a_two_percent_change_under_half_a_percent_noise_is_below_the_floor():
    for seed in range(50):
        rng = np.random.default_rng(seed)
        judgement = compare(_run(rng, 1.02), _run(rng))
        assert judgement.verdict == SAME, (seed, judgement.reason)
        assert 1.0 < judgement.ratio < 1.04


def test_a_six_percent_change_under_half_a_percent_noise_is_slow_and_its_reverse_fast():
    for seed in range(50):
        rng = np.random.default_rng(seed)
        base = _run(rng)
        assert compare(_run(rng, 1.06), base).verdict == SLOW
        assert compare(_run(rng, 1 / 1.06), base).verdict == FAST


def test_a_gap_the_clock_explains_is_ambiguous():
    rng = np.random.default_rng(5)
    base = _run(rng)
    new = base * 1.10  # the same work ...
    base_cycles = base * 1980e6
    new_cycles = new * 1800e6  # ... run at a clock 10% lower: the same cycles
    judgement = compare(new, base, new_cycles, base_cycles)
    assert judgement.verdict == AMBG
    assert "clock" in judgement.reason
    assert compare(new, base, new * 1980e6, base_cycles).verdict == SLOW


def test_a_slow_stands_only_when_it_recurs():
    rng = np.random.default_rng(6)
    base = _run(rng)
    first = compare(_run(rng, 1.10), base)
    assert first.verdict == SLOW
    stood = confirm(first, compare(_run(rng, 1.10), base))
    assert (stood.verdict, stood.reruns) == (SLOW, 1)
    gone = confirm(first, compare(_run(rng), base))
    assert gone.verdict == AMBG and "did not recur" in gone.reason
    same = compare(_run(rng), base)
    assert confirm(same, first) is same


def test_too_few_samples_are_never_a_verdict():
    rng = np.random.default_rng(8)
    judgement = compare(_run(rng, 2.0, count=MIN_JUDGED - 1), _run(rng))
    assert judgement.verdict == AMBG and "too few" in judgement.reason
    assert compare(_run(rng, 2.0, count=MIN_JUDGED), _run(rng)).verdict == SLOW


def test_a_gap_under_twice_the_timers_resolution_is_no_change():
    base = np.full(40, 3.0e-6)
    new = np.full(40, 3.5e-6)  # one tick of CUDA events' 0.5 us apart, every sample
    assert compare(new, base).verdict == SLOW
    judgement = compare(new, base, resolution=0.5e-6)
    assert judgement.verdict == SAME and "resolution" in judgement.reason
    assert compare(np.full(40, 5.0e-6), base, resolution=0.5e-6).verdict == SLOW
