"""The outlier-GPU rule of ``bench --devices`` on synthetic per-device step medians and samples."""

from __future__ import annotations

import numpy as np
import pytest

from csa_conform.bench.devices import MIN_DEVICES, outliers, step_medians
from csa_conform.bench.measure import STEP_ROW, TIMED, CaseBench, Row
from csa_conform.bench.run import DeviceRun
from csa_conform.bench.samples import Samples
from csa_conform.device.provenance import RunProvenance

CASE = "decode.r4-t4096"


def flagged(medians: dict[int, float]) -> list[int]:
    return [outlier.device for outlier in outliers({CASE: medians})]


def test_a_gpu_ten_percent_slower_than_three_alike_is_flagged():
    assert flagged({0: 1.000e-3, 1: 1.002e-3, 2: 0.999e-3, 3: 1.100e-3}) == [3]


def test_a_gpu_ten_percent_faster_is_flagged_too():
    assert flagged({0: 1.000e-3, 1: 1.002e-3, 2: 0.900e-3}) == [2]


def test_gpus_within_the_smallest_change_are_not_flagged():
    assert flagged({0: 1.000e-3, 1: 1.010e-3, 2: 0.995e-3, 3: 1.025e-3}) == []


def test_a_gpu_within_the_spread_of_noisy_others_is_not_flagged():
    """The others span 1.0-1.2 ms: 1.35 ms is 0.15 ms beyond them, under their 0.2 ms range."""
    assert flagged({0: 1.0e-3, 1: 1.2e-3, 2: 1.1e-3, 3: 1.35e-3}) == []
    assert flagged({0: 1.0e-3, 1: 1.2e-3, 2: 1.1e-3, 3: 1.45e-3}) == [3]


def test_two_gpus_flag_nothing_however_far_apart():
    assert MIN_DEVICES == 3
    assert flagged({0: 1.0e-3, 1: 2.0e-3}) == []


def test_each_case_is_judged_on_its_own():
    found = outliers({"a": {0: 1.0, 1: 1.0, 2: 1.5}, "b": {0: 2.0, 1: 2.6, 2: 2.0}, "c": {0: 1.0, 2: 9.0}})
    assert [(outlier.case, outlier.device) for outlier in found] == [("a", 2), ("b", 1)]
    assert found[0].to_dict()["others_s"] == [1.0, 1.0] and "step median 1500.0000 ms" in found[0].reason


def _run(device: int, times: np.ndarray) -> DeviceRun:
    bench = CaseBench(CASE, None, 0, [Row(STEP_ROW, (), TIMED, samples=Samples(times=list(map(float, times))))])
    return DeviceRun([bench], "cuda-events", (None, None), RunProvenance(None, {}), device=device)


@pytest.mark.parametrize("slower, expected", [(1.0, []), (1.08, [2])])
def test_samples_of_four_gpus_under_half_a_percent_noise(slower, expected):
    """Each GPU's samples: 1 ms with 0.5% noise and rare 3x stalls; GPU 2 is ``slower`` times slower."""
    rng = np.random.default_rng(7)
    runs = []
    for device in range(4):
        times = 1e-3 * (slower if device == 2 else 1.0) * (1 + 0.005 * rng.standard_normal(200))
        times[rng.random(200) < 0.03] *= 3
        runs.append(_run(device, times))
    medians = step_medians(runs)
    assert sorted(medians[CASE]) == [0, 1, 2, 3]
    assert [outlier.device for outlier in outliers(medians)] == expected
