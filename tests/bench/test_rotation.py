"""Rotated inputs of hot samples and the persisting-L2 reset of cold ones, without a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from csa_conform.device.recorder import Owned, RecordedLaunch
from csa_conform.bench.rotation import MAX_COPIES, ROTATE_FACTOR, copies_for, cycled, inputs, rotated
from csa_conform.bench.timers import persisting_reset

MIB = 1 << 20


class NumpyBackend:
    """Host arrays as 'device' buffers: upload and download copy."""

    @staticmethod
    def upload(array):
        return np.array(array, copy=True)

    @staticmethod
    def download(array):
        return np.array(array, copy=True)


@pytest.mark.parametrize("input_bytes, copies", [
    (ROTATE_FACTOR * 16 * MIB, 1),  # one set already holds twice the cache
    (ROTATE_FACTOR * 16 * MIB + 1, 1),
    (ROTATE_FACTOR * 16 * MIB // 2, 2),
    (ROTATE_FACTOR * 16 * MIB // 3 + 1, 3),
    (1024, MAX_COPIES),  # tiny inputs: capped, still inside the cache
    (0, 1),
])
def test_copies_hold_twice_the_cache_or_stop_at_the_cap(input_bytes, copies):
    assert copies_for(input_bytes, 16 * MIB) == copies


def _step():
    """Launch A reads x and w, writes y; launch B reads y (A's output) and x, writes z."""
    x, w = np.arange(8, dtype=np.float32), np.ones(4, dtype=np.float32)
    y, z = np.zeros(8, dtype=np.float32), np.zeros(8, dtype=np.float32)
    first = RecordedLaunch("a", None, (1, 1, 1), (8, 1, 1), (x, w, y, np.int32(8)), (Owned(2, y),), frozenset())
    second = RecordedLaunch("b", None, (1, 1, 1), (8, 1, 1), (y, x, z), (Owned(2, z),), frozenset())
    return [first, second], x, w, y, z


def test_only_buffers_no_launch_writes_are_inputs():
    launches, x, w, y, z = _step()
    assert [id(buffer) for buffer in inputs(launches)] == [id(x), id(w)]  # y is written inside the step
    assert [id(buffer) for buffer in inputs(launches[1:])] == [id(y), id(x)]  # alone, B reads y


def test_each_copy_has_the_inputs_bytes_at_other_addresses_and_the_same_outputs():
    launches, x, w, y, z = _step()
    input_bytes = x.nbytes + w.nbytes
    variants, rotation = rotated(NumpyBackend(), launches, cache_bytes=2 * input_bytes)
    assert rotation.copies == len(variants) == ROTATE_FACTOR * 2 and rotation.input_bytes == input_bytes
    assert rotation.exceeds_cache
    assert variants[0] == launches
    seen = set()
    for variant in variants:
        a, b = variant
        assert a.args[0] is b.args[1]  # one copy of x per variant, read by both launches
        assert a.args[2] is y and b.args[0] is y and b.args[2] is z  # written buffers are never copied
        assert a.owned == launches[0].owned and a.args[3] == np.int32(8)
        assert np.array_equal(a.args[0], x) and np.array_equal(a.args[1], w)
        seen.add(id(a.args[0]))
    assert len(seen) == len(variants)
    _, capped = rotated(NumpyBackend(), launches, cache_bytes=1 << 30)
    assert capped.copies == MAX_COPIES and not capped.exceeds_cache


def test_cycled_issues_each_copy_in_turn():
    done = []
    issue = cycled([lambda index=index: done.append(index) for index in range(3)])
    for _ in range(7):
        issue()
    assert done == [0, 1, 2, 0, 1, 2, 0]


class Runtime:
    """A CuPy runtime module stand-in."""


def test_the_persisting_reset_prefers_cupys_runtime_then_the_driver_else_says_none():
    calls = []
    runtime = Runtime()
    runtime.ctxResetPersistingL2Cache = lambda: calls.append("runtime")
    reset, how = persisting_reset(runtime)
    reset()
    assert calls == ["runtime"] and "cupy.cuda.runtime.ctxResetPersistingL2Cache" in how
    reset, how = persisting_reset(Runtime(), driver="libno-such-cuda-driver.so.1")
    assert reset is None and how.startswith("not reset: CuPy's runtime module has no ctxResetPersistingL2Cache")
