"""The sampling policy with scripted readings: throttled samples dropped, the noise stop, the time cap,
the warm-up that waits for a steady clock (the probe its first repetition, none started past its budget),
the repetitions counted, and interleaving."""

from __future__ import annotations

import itertools

import numpy as np

from csa_conform.bench.samples import (MIN_SAMPLES, WARMUP_MIN, Policy, Reading, Repetitions, Samples, Timed,
                                       collect, timed, warm_up)
from csa_conform.bench.stats import summarize

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


class Wall:
    """A fake perf_counter that only the synthetic launches advance."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Launch:
    """A synthetic repetition of ``wall_s`` seconds at a steady clock, counted; it advances ``wall``."""

    def __init__(self, wall_s: float, clock_mhz: float | None = MAX_CLOCK, wall: Wall | None = None):
        self.wall, self.wall_s, self.clock_mhz, self.count = wall or Wall(), wall_s, clock_mhz, 0

    def __call__(self) -> Reading:
        self.wall.now += self.wall_s
        self.count += 1
        return Reading(self.wall_s, self.clock_mhz)

    @property
    def now(self) -> float:
        return self.wall.now

    def probe(self) -> Timed:
        return timed(self, self.wall)


def test_the_probe_is_the_first_warm_up_repetition():
    launch = Launch(1e-3)
    (samples,) = collect([launch], Policy(time_cap=10.0), MAX_CLOCK, launch.wall, probes=[launch.probe()])
    assert samples.warmup == WARMUP_MIN - 1
    assert launch.count == 1 + samples.warmup + len(samples.times)
    assert samples.repetitions(probe=1) == Repetitions(1, WARMUP_MIN - 1, len(samples.times))


def test_a_probe_longer_than_the_warm_up_budget_is_the_whole_warm_up():
    launch = Launch(20.0)  # a launch of 20 s: the clock ran at load throughout the probe
    (samples,) = collect([launch], Policy(time_cap=2.0), MAX_CLOCK, launch.wall, probes=[launch.probe()])
    assert samples.warmup == 0 and len(samples.times) == 1 and samples.noisy
    assert launch.count == 2  # the probe and one sample, where the old rule spent probe, warm-up and sample


def test_no_warm_up_repetition_is_started_that_would_end_past_the_budget():
    for wall_s, expected in ((0.3, 0), (0.2, 1), (0.1, WARMUP_MIN - 1)):
        launch = Launch(wall_s)
        assert warm_up(launch, 0.5, launch.wall, launch.probe()) == expected, wall_s
        assert launch.now <= 0.5


def test_warm_up_without_a_probe_counts_its_own_first_repetition():
    launch = Launch(0.3)
    assert warm_up(launch, 0.5, launch.wall) == 1  # the first, then none that would end at 0.6
    unclocked = Launch(1e-3, None)
    assert warm_up(unclocked, 10.0, unclocked.wall, unclocked.probe()) == WARMUP_MIN - 1


def test_throttled_samples_are_counted_as_repetitions_spent():
    ticks = itertools.count()
    launch = Launch(1e-3)

    def reading() -> Reading:
        launch()
        return Reading(1e-3, 900.0 if next(ticks) % 2 else MAX_CLOCK)

    (samples,) = collect([reading], Policy(time_cap=0.1), MAX_CLOCK, launch.wall, probes=[timed(reading, launch.wall)])
    spent = samples.repetitions(probe=1)
    assert samples.throttled > 0 and spent.samples == len(samples.times) + samples.throttled
    assert spent.probe + spent.warmup + spent.samples == launch.count
    assert spent + Repetitions(1, 2, 3) == Repetitions(2, spent.warmup + 2, spent.samples + 3)


def test_interleaved_probes_each_start_their_own_side_s_warm_up():
    wall = Wall()
    new, base = Launch(0.2, wall=wall), Launch(0.2, wall=wall)
    results = collect([new, base], Policy(time_cap=2.0), MAX_CLOCK, wall, probes=[new.probe(), base.probe()])
    assert [result.warmup for result in results] == [1, 1]  # 0.2 + 0.2 fits the 0.5 s budget, a third would not
    assert new.count == base.count == 2 + len(results[0].times)


def test_the_summary_is_the_samples_statistics_and_follows_a_new_sample():
    rng = np.random.default_rng(3)
    samples = Samples()
    for _ in range(30):
        samples.keep(Reading(1e-3 * (1 + rng.normal(0, 1e-2))), None)
    assert samples.summary() == summarize(samples.times)
    samples.keep(Reading(5e-3), None)
    assert samples.summary() == summarize(samples.times) and samples.summary().count == 31
