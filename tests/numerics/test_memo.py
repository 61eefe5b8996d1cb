"""glibc's libm remembered: the same bits as the function, each argument array evaluated once while it fits."""

import numpy as np
import pytest

from csa_conform.numerics import libm
from csa_conform.numerics.memo import Remembered
from csa_conform.numerics.variant import GLIBC


def _counted(function):
    calls = []

    def counted(*args):
        calls.append(tuple(np.asarray(arg).shape for arg in args))
        return function(*args)
    return counted, calls


def _bits(array) -> np.ndarray:
    return np.asarray(array, dtype=np.float32).view(np.uint32)


def test_a_seen_argument_array_is_not_evaluated_again_and_returns_the_functions_bits():
    counted, calls = _counted(libm.expf)
    expf = Remembered(counted)
    x = np.random.default_rng(3).standard_normal((4, 33)).astype(np.float32) * 40
    first, again = expf(x), expf(x.copy())
    assert len(calls) == 1
    assert np.array_equal(_bits(first), _bits(libm.expf(x))) and np.array_equal(_bits(again), _bits(first))


@pytest.mark.parametrize("other", [
    pytest.param(lambda x: np.where(x == 0, np.float32(-0.0), x), id="-0 for +0"),
    pytest.param(lambda x: np.where(np.isnan(x), np.uint32(0x7FC00001).view(np.float32), x), id="another NaN payload"),
    pytest.param(lambda x: x.reshape(2, -1), id="another shape"),
])
def test_arguments_that_differ_in_any_bit_or_in_shape_are_evaluated_anew(other):
    counted, calls = _counted(libm.sinf)
    sinf = Remembered(counted)
    x = np.array([0.0, np.nan, 1.5, -2.25], dtype=np.float32)
    changed = other(x)
    sinf(x)
    found = sinf(changed)
    assert len(calls) == 2
    assert found.shape == changed.shape and np.array_equal(_bits(found), _bits(libm.sinf(changed)))


def test_a_caller_writing_into_a_result_does_not_change_what_is_remembered():
    expf = Remembered(libm.expf)
    x = np.linspace(-3, 3, 16, dtype=np.float32)
    expf(x)[:] = 0
    expf(x)[:] = 0
    assert np.array_equal(_bits(expf(x)), _bits(libm.expf(x)))


def test_two_argument_functions_key_on_both_arguments():
    counted, calls = _counted(libm.powf)
    powf = Remembered(counted)
    base, exponent = np.float32(10000.0), np.arange(8, dtype=np.float32) / 8
    powf(base, exponent)
    found = powf(np.float32(9999.0), exponent)
    assert len(calls) == 2 and np.array_equal(_bits(found), _bits(libm.powf(np.float32(9999.0), exponent)))


def test_past_its_budget_the_least_recently_used_is_dropped_and_large_arrays_are_not_kept():
    counted, calls = _counted(libm.cosf)
    cosf = Remembered(counted, budget=3 * 2 * 64 * 4)  # three 64-element entries, arguments and results
    arrays = [np.full(64, value, dtype=np.float32) for value in (1, 2, 3, 4)]
    for array in arrays[:3]:
        cosf(array)
    cosf(arrays[0])  # used again: arrays[1] is now the least recent
    cosf(arrays[3])
    assert len(calls) == 4
    cosf(arrays[0]), cosf(arrays[2]), cosf(arrays[3])
    assert len(calls) == 4
    cosf(arrays[1])
    assert len(calls) == 5
    large = np.zeros(4096, dtype=np.float32)
    cosf(large), cosf(large)
    assert len(calls) == 7


def test_the_glibc_functions_explain_asks_are_remembered():
    assert all(isinstance(function, Remembered) for function in GLIBC.values())
