"""Comparison of two payloads, blind to where they came from: bit equality first, then where the
mismatches sit and how large they are, and the calibrated tolerances of the official profile."""

from csa_conform.compare.bitwise import TensorDiff, compare_payloads, compare_tensor
from csa_conform.compare.testing import assert_bits_equal, assert_payloads_equal

__all__ = ["TensorDiff", "assert_bits_equal", "assert_payloads_equal", "compare_payloads", "compare_tensor"]
