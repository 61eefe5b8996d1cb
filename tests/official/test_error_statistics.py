"""The statistics gap, calibrate and diff --tolerance report, on arrays whose answers are known."""

from __future__ import annotations

import numpy as np
import pytest

from csa_conform.compare.errorstats import TensorErrors, cosine_distance, ordered_bits


def test_ulp_distance_counts_representable_values_across_zero():
    values = np.array([1.0, -0.0, 0.0, np.nextafter(np.float32(0), np.float32(1))], dtype=np.float32)
    bits = ordered_bits(values)
    assert bits[3] - bits[2] == 1 and bits[2] - bits[1] == 1
    assert ordered_bits(np.array([np.nextafter(np.float32(1), np.float32(2))], np.float32))[0] - bits[0] == 1


def test_float_errors():
    errors = TensorErrors("sparse_sink_softmax_attention", "scores")
    expected = np.array([[1.0, 2.0, -np.inf, 4.0]], dtype=np.float32)
    actual = np.array([[1.0, 2.5, -np.inf, -np.inf]], dtype=np.float32)
    errors.add(expected, actual)
    entry = errors.entry()
    assert entry["identical"] == 2 and entry["elements"] == 4 and entry["steps_identical"] == 0
    assert entry["neginf_mask_mismatches"] == 1
    assert entry["abs"]["max"] == 0.5 and entry["rel"]["max"] == 0.25
    assert entry["ulp"]["max"] == 2**21  # 2.0 -> 2.5: a quarter of the binade's 2^23 steps


def test_index_sets_and_rank_changes():
    errors = TensorErrors("selection", "selected")
    expected = np.array([[[3, 1, 2, -1], [0, 1, 2, 3]]], dtype=np.int32)
    actual = np.array([[[1, 3, 2, -1], [0, 1, 2, 4]]], dtype=np.int32)
    errors.add(expected, actual)
    sets = errors.entry()["sets"]
    assert sets["rows"] == 2 and sets["rows_identical"] == 0
    assert sets["overlap_min"] == 0.75 and sets["overlap_mean"] == pytest.approx(0.875)
    assert sets["rank_changes"] == 3


def test_argmax_identity_of_y_rows():
    errors = TensorErrors("sparse_sink_softmax_attention", "Y")
    expected = np.array([[[[0.1, 0.9, 0.0]], [[0.5, 0.2, 0.1]]]], dtype=np.float32)
    actual = np.array([[[[0.1, 0.8, 0.0]], [[0.4, 0.6, 0.1]]]], dtype=np.float32)
    errors.add(expected, actual)
    assert errors.entry()["argmax"] == {"rows": 2, "identical": 1}


def test_merging_is_adding_the_steps():
    one, other, both = (TensorErrors("s", "t") for _ in range(3))
    a = np.array([1.0, 2.0], np.float32)
    b = np.array([1.0, 3.0], np.float32)
    one.add(a, b)
    other.add(b, b)
    both.add(a, b)
    both.add(b, b)
    one.merge(other)
    assert one.entry() == both.entry()


def test_cosine_distance():
    x = np.array([1.0, 0.0])
    assert cosine_distance(x, x) == 0.0
    assert cosine_distance(x, np.array([0.0, 1.0])) == 1.0
    assert cosine_distance(np.zeros(2), np.zeros(2)) == 0.0
