"""The device libm probe: CUDA's binary32 libm (and its double functions rounded once), evaluated on the
run's device with the run's build, for the device-libm hypotheses (csa_conform.explain.hypotheses).

It is measured once per kernel directory and build, and reused: each distinct argument is evaluated on the
device once and kept (the RoPE angles and many expf arguments recur from case to case), and per function
the distinct arguments seen and those where the device differs from the reference's (glibc) function are
counted; ``measured()`` is that evidence for the whole run, reported once at the top of the explanations.
"""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from csa_conform.device.runner import DeviceRunner
from csa_conform.errors import DeviceUnavailable
from csa_conform.numerics.variant import GLIBC


class DeviceLibm:
    """One device's libm under one build: evaluations memoised by argument bits, differences from glibc's
    counted per function."""

    def __init__(self, probe: Callable, build, where: str):
        self._probe, self._build, self.where = probe, build, where
        self._lock = threading.Lock()  # the oracle's query chunks evaluate it from several threads
        self._keys: dict[str, np.ndarray] = {}
        self._values: dict[str, np.ndarray] = {}
        self._differing: dict[str, int] = {}

    def function(self, name: str) -> Callable:
        def evaluate(*args):
            arrays = np.broadcast_arrays(*(np.asarray(arg, dtype=np.float32) for arg in args))
            with self._lock:
                return self._evaluate(name, arrays).reshape(arrays[0].shape)
        return evaluate

    def _evaluate(self, name: str, arrays: list[np.ndarray]) -> np.ndarray:
        bits = [np.ascontiguousarray(array).reshape(-1).view(np.uint32).astype(np.uint64) for array in arrays]
        key = bits[0] if len(bits) == 1 else (bits[0] << np.uint64(32)) | bits[1]
        known = self._keys.get(name, np.zeros(0, np.uint64))
        values = self._values.get(name, np.zeros(0, np.float32))
        where = np.searchsorted(known, key)
        if known.size and np.array_equal(known[np.minimum(where, known.size - 1)], key):
            return values[where]  # every argument evaluated before: a sorted lookup, no hashing of the calls
        missing = np.setdiff1d(key, known)
        if missing.size:
            parts = [(missing >> np.uint64(32)).astype(np.uint32), (missing & np.uint64(0xFFFFFFFF)).astype(np.uint32)]
            args = (parts[1].view(np.float32),) if len(bits) == 1 else (parts[0].view(np.float32),
                                                                        parts[1].view(np.float32))
            found = np.asarray(self._probe(name, args, self._build), dtype=np.float32).reshape(-1)
            with np.errstate(all="ignore"):
                reference = np.asarray(GLIBC[name.split("-")[0]](*args), dtype=np.float32).reshape(-1)
            self._differing[name] = self._differing.get(name, 0) + int(np.count_nonzero(
                found.view(np.uint32) != reference.view(np.uint32)))
            known, values = np.concatenate([known, missing]), np.concatenate([values, found])
            order = np.argsort(known, kind="stable")
            known, values = known[order], values[order]
            self._keys[name], self._values[name] = known, values
        return values[np.searchsorted(known, key)]

    def measured(self) -> dict[str, dict[str, int]]:
        """Per function evaluated: the distinct arguments seen and those the device rounds otherwise than glibc."""
        return {name: {"arguments": int(keys.size), "differing": self._differing.get(name, 0)}
                for name, keys in sorted(self._keys.items())}


_MEASURED: dict[tuple[str, str], DeviceLibm] = {}


def device_libm(runner: DeviceRunner) -> tuple[Callable[[str], Callable] | None, str | None]:
    """CUDA's libm on this run's device (compiled with the run's build), or why it is unavailable; one
    measurement per kernel directory and build, shared by every case of the run."""
    if runner.provider is not None:
        return None, (f"{runner.provider.name} is a python: provider; the device libm is measured by a module "
                      "built with the kernel directory's options, which a provider has none of")
    try:
        device, offered = runner.backend_call("info").name, runner.offers("evaluate_libm")
    except DeviceUnavailable as error:
        return None, f"no CUDA device: {error}"
    if not offered:
        return None, (f"{device} has no CUDA libm to evaluate; its stand-in for the platform libm "
                      "is correctly rounded, which the correctly-rounded hypotheses cover")

    def probe(name: str, args: tuple, build) -> np.ndarray:
        return runner.backend_call("evaluate_libm", name, args, build)

    build = runner.kernels.build
    where = f"{device}, {runner.kernels.path}, build {build.name}"
    measured = _MEASURED.setdefault((where, repr(build)), DeviceLibm(probe, build, where))
    return measured.function, None


def measured() -> list[dict]:
    """The device libm measured in this run: per kernel directory and build, each function's counts."""
    return [{"where": libm.where, "functions": libm.measured()} for libm in _MEASURED.values() if libm.measured()]
