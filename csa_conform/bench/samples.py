"""How many samples a row gets: warm-up until the clock is steady, then until the median is known well enough.

Warm-up repetitions run until two in a row read the same SM clock (within
STEADY; at least WARMUP_MIN of them, at most a quarter of the time cap), so
the first samples are not taken while the GPU still ramps its clock. The
probe (the repetition checked against the conformance run before sampling)
is the first of them, and none is started that the budget already forbids
(the last one's wall time says when the next would end): one repetition
longer than the budget, a launch of seconds, is the whole warm-up, the clock
having run at load throughout it. Then
samples are taken until the bootstrap CI of their median is narrower than
±0.5% of it (checked from MIN_SAMPLES on) or the time cap is spent; a row
stopped by the cap is marked ``noisy``. A sample whose SM clock is below 75%
of the device's maximum ran throttled: it is dropped and counted, never
mixed into the median. Several subjects (new and baseline kernels) can be
sampled interleaved, one sample each in turn, so both see the same clocks
and temperatures. Every repetition is counted (``Repetitions``: probe,
warm-up, samples kept or throttled), so what a row spent beyond its kept
samples is in the results document.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
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
class Timed:
    """A repetition's reading and its wall seconds (poisoning, flush and launch: what the next one costs)."""

    reading: Reading
    wall_s: float


def timed(sample: Callable[[], Reading], now: Callable[[], float] = time.perf_counter) -> Timed:
    started = now()
    reading = sample()
    return Timed(reading, now() - started)


@dataclass(frozen=True)
class Repetitions:
    """The repetitions a row launched besides the conformance run: probe, warm-up and samples (kept or throttled)."""

    probe: int = 0
    warmup: int = 0
    samples: int = 0

    def __add__(self, other: Repetitions) -> Repetitions:
        return Repetitions(self.probe + other.probe, self.warmup + other.warmup, self.samples + other.samples)

    def to_dict(self) -> dict:
        return asdict(self)


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
    warmup: int = 0  # after the probe, which is the first warm-up repetition
    throttled: int = 0
    noisy: bool = False
    elapsed_s: float = 0.0
    _summary: tuple[tuple[float, ...], Summary] | None = field(default=None, init=False, repr=False, compare=False)

    def keep(self, reading: Reading, max_clock: float | None) -> None:
        if max_clock and reading.clock_mhz is not None and reading.clock_mhz < THROTTLED * max_clock:
            self.throttled += 1
            return
        self.times.append(reading.seconds)
        self.clocks.append(reading.clock_mhz)
        self.temperatures.append(reading.temperature_c)

    def repetitions(self, probe: int) -> Repetitions:
        return Repetitions(probe, self.warmup, len(self.times) + self.throttled)

    def cycles(self) -> list[float] | None:
        """Each sample in SM cycles (seconds × clock), None unless every sample read a clock."""
        if not self.clocks or any(clock is None for clock in self.clocks):
            return None
        return [seconds * clock * 1e6 for seconds, clock in zip(self.times, self.clocks)]

    def summary(self) -> Summary:
        """The samples' statistics, bootstrapped once per set of samples (the roofline, the step's ratio and
        the section each read them; thousands of samples take a while)."""
        key = tuple(self.times)
        if self._summary is None or self._summary[0] != key:
            self._summary = (key, summarize(self.times))
        return self._summary[1]

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


def warm_up(sample: Callable[[], Reading], budget: float, now: Callable[[], float] = time.perf_counter,
            probe: Timed | None = None) -> int:
    """Repetitions until two in a row read the same clock (or, without a clock, WARMUP_MIN), ``probe`` (when
    given) counted as the first; none started that would end past ``budget``. Returns how many it ran."""
    last = probe if probe is not None else timed(sample, now)
    count, ran, spent, previous = 1, int(probe is None), last.wall_s, None
    while True:
        clock = last.reading.clock_mhz
        steady = clock is None or previous is not None and abs(clock - previous) <= STEADY * previous
        if count >= WARMUP_MIN and steady or spent + last.wall_s > budget:
            return ran
        previous = clock
        last = timed(sample, now)
        count, ran, spent = count + 1, ran + 1, spent + last.wall_s


def collect(subjects: Sequence[Callable[[], Reading]], policy: Policy, max_clock: float | None,
            now: Callable[[], float] = time.perf_counter, probes: Sequence[Timed] | None = None) -> list[Samples]:
    """Samples of every subject, taken in turn until each is settled or the time cap is spent; each
    subject's probe (when given) is its first warm-up repetition."""
    results = [Samples() for _ in subjects]
    for index, (subject, result) in enumerate(zip(subjects, results)):
        result.warmup = warm_up(subject, policy.time_cap / 4, now, probes[index] if probes else None)
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
