"""Bit-equality assertions for tests: equal means equal bit patterns, never a tolerance.

A failure names the first differing element with its coordinates, values and
bit patterns (the comparison is csa_conform.compare.bitwise's, so a test says exactly
what ``diff`` would), or the dtype or shape that differs.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from csa_conform.compare.bitwise import compare_tensor
from csa_conform.numerics.bits import same_bits

__all__ = ["assert_bits_equal", "assert_payloads_equal", "same_bits"]


def assert_bits_equal(actual, expected, name: str = "tensor") -> None:
    """Fail naming the first differing element of ``actual`` against ``expected``."""
    if same_bits(actual, expected):
        return
    stage, _, tensor = name.rpartition("/")
    diff = compare_tensor(expected, actual, stage=stage, tensor=tensor)
    raise AssertionError(diff.summary())


def assert_payloads_equal(
    actual: Mapping[str, Mapping[str, np.ndarray]], expected: Mapping[str, Mapping[str, np.ndarray]]
) -> None:
    """Every stage -> tensor of ``expected`` present in ``actual`` with the same bits, and nothing extra."""
    assert sorted(actual) == sorted(expected), f"stages differ: {sorted(actual)} != {sorted(expected)}"
    for stage, tensors in expected.items():
        assert sorted(actual[stage]) == sorted(tensors), f"{stage}: tensors {sorted(actual[stage])} != {sorted(tensors)}"
        for tensor, array in tensors.items():
            assert_bits_equal(actual[stage][tensor], array, f"{stage}/{tensor}")
