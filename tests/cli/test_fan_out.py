"""--jobs and --devices work (csa_conform._base.pool): the heaviest items start first, results still come back
in item order."""

from __future__ import annotations

from concurrent.futures import Future

import csa_conform._base.pool as pool
from csa_conform.cli.common import fan_out


class RecordingPool:
    """Runs each item at once, recording the order they were submitted in."""

    submitted: list = []

    def __init__(self, **_options):
        RecordingPool.submitted = []

    def submit(self, function, item):
        RecordingPool.submitted.append(item)
        done = Future()
        done.set_result(function(item))
        return done

    def shutdown(self, **_options):
        pass


def test_the_heaviest_items_are_submitted_first_ties_in_item_order(monkeypatch):
    monkeypatch.setattr(pool, "ProcessPoolExecutor", RecordingPool)
    assert list(fan_out(str.upper, ["a", "b", "c", "d"], 2, [1, 1, 5, 2])) == ["A", "B", "C", "D"]
    assert RecordingPool.submitted == ["c", "d", "a", "b"]


def test_results_come_back_in_item_order_from_real_workers():
    assert list(fan_out(abs, [-1, -2, -3, -4, -5], 2, [1, 9, 2, 8, 3])) == [1, 2, 3, 4, 5]
