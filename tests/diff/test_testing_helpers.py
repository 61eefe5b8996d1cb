"""csa_conform.compare.testing: bit equality that names the first differing element."""

from __future__ import annotations

import numpy as np
import pytest

from csa_conform.compare.testing import assert_bits_equal, assert_payloads_equal, same_bits


def test_negative_zero_is_not_positive_zero():
    with pytest.raises(AssertionError, match=r"first at a0=1: expected 0.0 \[0x00000000\], actual -0.0 \[0x80000000\]"):
        assert_bits_equal(np.array([1.0, -0.0], np.float32), np.array([1.0, 0.0], np.float32), "stage/t")


def test_nan_payloads_differ_and_identical_nans_are_equal():
    quiet = np.array([0x7FC00000], np.uint32).view(np.float32)
    other = np.array([0x7FC00001], np.uint32).view(np.float32)
    assert same_bits(quiet, quiet.copy())
    assert not same_bits(quiet, other)


def test_dtype_and_shape_are_named():
    with pytest.raises(AssertionError, match="dtype differs: expected int32, actual int64"):
        assert_bits_equal(np.zeros(2, np.int64), np.zeros(2, np.int32), "selection/selected")
    with pytest.raises(AssertionError, match=r"shape differs: expected \[2\], actual \[3\]"):
        assert_bits_equal(np.zeros(3, np.int32), np.zeros(2, np.int32))


def test_payload_maps_name_the_stage_and_tensor():
    expected = {"selection": {"selected": np.array([[[0, 1, -1]]], np.int32)}}
    actual = {"selection": {"selected": np.array([[[0, 2, -1]]], np.int32)}}
    assert_payloads_equal(expected, {"selection": {"selected": expected["selection"]["selected"].copy()}})
    with pytest.raises(AssertionError, match=r"selection/selected: 1/3 elements differ; first at b=0 s=0 k=1"):
        assert_payloads_equal(actual, expected)
    with pytest.raises(AssertionError, match="stages differ"):
        assert_payloads_equal({}, expected)
