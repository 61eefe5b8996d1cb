"""The roofline verdict of a row: the bound by the ridge point and the % of that bound's peak, by hand."""

from __future__ import annotations

import pytest

from csa_conform.bench.roofline import Work, nominal_peaks, roofline

H200 = {"bandwidth_bytes_per_s": 4.8e12, "ops_per_s": 67e12}


def test_a_row_below_the_ridge_is_memory_bound_at_its_bandwidth_share():
    entry = roofline(Work(1e9, 1e9), 1e-3, H200, None)  # 1 op/byte, ridge 67/4.8 = 13.96 ops/byte
    assert entry["bytes_per_s"] == pytest.approx(1e12)
    assert entry["nominal"]["bound"] == "memory"
    assert entry["nominal"]["percent"] == pytest.approx(100 / 4.8)
    assert entry["measured"] is None


def test_a_row_above_the_ridge_is_compute_bound_at_its_operations_share():
    entry = roofline(Work(1e6, 1e11), 1e-2, H200, {"bandwidth_bytes_per_s": 2e12, "ops_per_s": 4e13})
    assert entry["nominal"]["bound"] == "compute"
    assert entry["nominal"]["percent"] == pytest.approx(100 * 1e13 / 67e12)
    assert entry["measured"] == {"bound": "compute", "percent": pytest.approx(25.0)}


def test_a_row_without_operations_is_memory_bound():
    assert roofline(Work(4.8e9, 0), 1e-3, H200, None)["nominal"] == {"bound": "memory", "percent": pytest.approx(100)}


def test_the_h200_has_the_data_sheets_peaks_and_an_unknown_device_none():
    peaks = nominal_peaks("NVIDIA H200")
    assert (peaks["bandwidth_bytes_per_s"], peaks["ops_per_s"]) == (4.8e12, 67e12)
    assert nominal_peaks("host emulation (g++)") is None and nominal_peaks(None) is None
