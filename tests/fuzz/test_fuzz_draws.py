"""The edges fuzz's draws reach, read off the drawn geometry (no oracle, no device): ratio-4 queries past
position 127 whose dense window starts inside current_kv (every window offset), long ratio-128 carries
a step completes, B > 1, and record counts at powers of two."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, seed, settings

from csa_conform.contract import DENSE_WINDOW
from csa_conform.repro.fuzz import draws

DRAWS = 300


@pytest.fixture(scope="module")
def specs():
    drawn = []

    @seed(11)
    @settings(max_examples=DRAWS, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(draws())
    def collect(draw):
        drawn.append(draw.spec)

    collect()
    return drawn


def _steps(spec):
    for index, (start, length) in enumerate(zip(spec.starts(), spec.chunks)):
        yield start, length, spec.kv_window(index, start, length)


def _window_inside_kv(spec) -> set[int]:
    """Kc past the minimum of each step whose first query's window starts inside current_kv."""
    return {kc - (start + length - max(0, start + 1 - DENSE_WINDOW)) for start, length, kc in _steps(spec)
            if start + 1 - DENSE_WINDOW > start + length - kc}


def test_ratio_4_steps_past_the_window_fill_are_drawn_at_many_window_offsets(specs):
    offsets = set().union(*(_window_inside_kv(spec) for spec in specs if spec.ratio == 4))
    assert {1, 2, 3, 64} <= offsets and len(offsets) >= 6
    past = [spec for spec in specs if spec.ratio == 4 and spec.start >= DENSE_WINDOW]
    assert len(past) >= DRAWS // 20 and min(spec.index_heads for spec in past) >= 3


def test_long_ratio_128_carries_are_completed_inside_a_step(specs):
    completed = {spec.start % 128 for spec in specs if spec.ratio == 128 and spec.start % 128 >= 64
                 and any((start % 128) + length >= 128 for start, length, _ in _steps(spec))}
    assert {126, 127} <= completed


def test_batches_above_one_and_power_of_two_record_counts_are_weighted_in(specs):
    assert sum(spec.batch > 1 for spec in specs) >= DRAWS // 2 and max(spec.batch for spec in specs) == 4
    for ratio, powers in ((4, {1, 2, 4, 8, 16, 32, 64}), (128, {1, 2, 4, 8})):
        records = {spec.start // ratio for spec in specs if spec.ratio == ratio}
        assert powers <= records, (ratio, sorted(records))
