"""How many samples a row gets: warm-up until the clock is steady, then until the median is known well enough.

Warm-up repetitions run until two in a row read the same SM clock (within
STEADY; at least WARMUP_MIN of them, at most a quarter of the time cap), so
the first samples are not taken while the GPU still ramps its clock. Then
samples are taken until the bootstrap CI of their median is narrower than
±0.5% of it (checked from MIN_SAMPLES on) or the time cap is spent; a row
stopped by the cap is marked ``noisy``. A sample whose SM clock is below 75%
of the device's maximum ran throttled: it is dropped and counted, never
mixed into the median. Several subjects (new and baseline kernels) can be
sampled interleaved, one sample each in turn, so both see the same clocks
and temperatures.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from csa_conform.bench.stats import Summary, median_ci, summarize

MIN_SAMPLES = 20
TARGET_NOISE = 0.005
MAX_SAMPLES = 5000
WARMUP_MIN = 3
STEADY = 0.01
THROTTLED = 0.75
CHECK_EVERY = 10
STOP_RESAMPLES = 500


@dataclass(frozen=True)
class Reading:
    """One repetition: seconds it took, and the SM clock (MHz) and temperature (C) read with it."""

    seconds: float
    clock_mhz: float | None = None
    temperature_c: float | None = None


@dataclass(frozen=True)
class Policy:
    """When sampling stops: the noise target, the minimum count and the time cap (seconds per row)."""

    time_cap: float = 2.0
    min_samples: int = MIN_SAMPLES
    target_noise: float = TARGET_NOISE
    max_samples: int = MAX_SAMPLES


@dataclass
class Samples:
    """A row's kept samples and what was left out of them."""

    times: list[float] = field(default_factory=list)
    clocks: list[float | None] = field(default_factory=list)
    temperatures: list[float | None] = field(default_factory=list)
    warmup: int = 0
    throttled: int = 0
    noisy: bool = False
    elapsed_s: float = 0.0

    def keep(self, reading: Reading, max_clock: float | None) -> None:
        if max_clock and reading.clock_mhz is not None and reading.clock_mhz < THROTTLED * max_clock:
            self.throttled += 1
            return
        self.times.append(reading.seconds)
        self.clocks.append(reading.clock_mhz)
        self.temperatures.append(reading.temperature_c)

    def cycles(self) -> list[float] | None:
        """Each sample in SM cycles (seconds × clock), None unless every sample read a clock."""
        if not self.clocks or any(clock is None for clock in self.clocks):
            return None
        return [seconds * clock * 1e6 for seconds, clock in zip(self.times, self.clocks)]

    def summary(self) -> Summary:
        return summarize(self.times)

    def settled(self, policy: Policy) -> bool:
        """At least min_samples kept and a median known to ±target_noise."""
        if len(self.times) < policy.min_samples:
            return False
        low, high = median_ci(self.times, STOP_RESAMPLES)
        median = float(np.median(self.times))
        return median > 0 and (high - low) / 2 / median < policy.target_noise

    def to_dict(self) -> dict:
        return {"times_s": self.times, "clocks_mhz": self.clocks, "temperatures_c": self.temperatures,
                "warmup": self.warmup, "throttled": self.throttled, "noisy": self.noisy, "elapsed_s": self.elapsed_s}


def warm_up(sample: Callable[[], Reading], budget: float, now: Callable[[], float] = time.perf_counter) -> int:
    """Repetitions until two in a row read the same clock (or, without a clock, WARMUP_MIN); returns the count."""
    started, count, previous = now(), 0, None
    while True:
        reading = sample()
        count += 1
        steady = (reading.clock_mhz is None or previous is not None
                  and abs(reading.clock_mhz - previous) <= STEADY * previous)
        if count >= WARMUP_MIN and steady or now() - started > budget:
            return count
        previous = reading.clock_mhz


def collect(subjects: Sequence[Callable[[], Reading]], policy: Policy, max_clock: float | None,
            now: Callable[[], float] = time.perf_counter) -> list[Samples]:
    """Samples of every subject, taken in turn until each is settled or the time cap is spent."""
    results = [Samples() for _ in subjects]
    for subject, result in zip(subjects, results):
        result.warmup = warm_up(subject, policy.time_cap / 4, now)
    started, rounds = now(), 0
    while True:
        for subject, result in zip(subjects, results):
            result.keep(subject(), max_clock)
        rounds += 1
        if rounds >= policy.min_samples and rounds % CHECK_EVERY == 0 and all(
                result.settled(policy) for result in results):
            break
        if now() - started > policy.time_cap or rounds >= policy.max_samples:
            for result in results:
                result.noisy = not result.settled(policy)
            break
    for result in results:
        result.elapsed_s = now() - started
    return results
