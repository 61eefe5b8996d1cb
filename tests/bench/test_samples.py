"""The sampling policy with scripted readings: throttled samples dropped, the noise stop, the time cap,
the warm-up that waits for a steady clock, and interleaving."""

from __future__ import annotations

import itertools

import numpy as np

from csa_conform.bench.samples import MIN_SAMPLES, Policy, Reading, collect, warm_up

MAX_CLOCK = 1980.0


class Clock:
    """A fake perf_counter that advances ``step`` seconds per call."""

    def __init__(self, step: float = 1e-3):
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_throttled_samples_are_dropped_and_counted():
    rng = np.random.default_rng(0)
    ticks = itertools.count()

    def reading() -> Reading:
        throttled = next(ticks) % 3 == 2
        seconds = 2e-3 if throttled else 1e-3 * (1 + rng.normal(0, 1e-4))
        return Reading(seconds, 1000.0 if throttled else MAX_CLOCK, 60.0)

    (samples,) = collect([reading], Policy(time_cap=10.0), MAX_CLOCK, Clock())
    assert samples.throttled > 0
    assert len(samples.times) >= MIN_SAMPLES
    assert max(samples.times) < 1.1e-3  # no throttled time reached the median
    assert all(clock == MAX_CLOCK for clock in samples.clocks)


def test_every_sample_throttled_leaves_none():
    (samples,) = collect([lambda: Reading(1e-3, 900.0)], Policy(time_cap=0.05), MAX_CLOCK, Clock())
    assert samples.times == [] and samples.throttled > 0 and samples.noisy


def test_a_quiet_row_stops_once_its_median_is_known():
    rng = np.random.default_rng(1)
    (samples,) = collect([lambda: Reading(1e-3 * (1 + rng.normal(0, 1e-3)))], Policy(time_cap=10.0), None, Clock())
    assert not samples.noisy
    assert MIN_SAMPLES <= len(samples.times) <= 40
    assert samples.summary().noise < 0.005


def test_a_noisy_row_stops_at_the_time_cap_marked_noisy():
    rng = np.random.default_rng(2)
    clock = Clock(1e-3)
    (samples,) = collect([lambda: Reading(rng.uniform(1e-3, 3e-3))], Policy(time_cap=0.2), None, clock)
    assert samples.noisy
    assert samples.elapsed_s < 0.25
    assert samples.summary().noise >= 0.005


def test_warm_up_waits_for_a_steady_clock():
    clocks = iter([800.0, 1200.0, 1600.0, 1900.0, 1975.0, 1976.0, 1976.0, 1976.0])
    assert warm_up(lambda: Reading(1e-3, next(clocks)), budget=10.0, now=Clock()) == 6


def test_warm_up_without_a_clock_is_the_minimum():
    assert warm_up(lambda: Reading(1e-3), budget=10.0, now=Clock()) == 3


def test_interleaved_subjects_are_sampled_in_turn():
    order = []

    def subject(name):
        def reading():
            order.append(name)
            return Reading(1e-3)
        return reading

    new, base = collect([subject("new"), subject("base")], Policy(time_cap=10.0), None, Clock())
    timed = order[6:]  # after each subject's three warm-up repetitions
    assert timed[:6] == ["new", "base"] * 3
    assert len(new.times) == len(base.times)
