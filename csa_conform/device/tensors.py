"""A step's named tensors, held on the host, the device or both.

Kernels want device buffers, host-oracle stages and payload comparison want
NumPy arrays, and a chained stream hands device buffers from one step to the
next. Each tensor is copied across on first need, once per step, so a stage
forced to the host costs one download and an all-host run never touches CUDA.
"""

from __future__ import annotations

from typing import Callable

import numpy as np


class StepTensors:
    """Tensors by name; ``backend`` is called only when a copy must cross."""

    def __init__(self, backend: Callable[[], object]):
        self._backend = backend
        self._host: dict[str, np.ndarray] = {}
        self._device: dict[str, object] = {}

    def put(self, name: str, value) -> None:
        self._host.pop(name, None)
        self._device.pop(name, None)
        if isinstance(value, np.ndarray) or np.isscalar(value):
            self._host[name] = np.asarray(value)
        else:
            self._device[name] = value

    def host(self, name: str) -> np.ndarray:
        if name not in self._host:
            self._host[name] = self._backend().download(self._device[name])
        return self._host[name]

    def device(self, name: str):
        if name not in self._device:
            self._device[name] = self._backend().upload(self._host[name])
        return self._device[name]

    def produced(self, name: str):
        """The tensor where it lives now (device array if it was made or copied there)."""
        return self._device[name] if name in self._device else self._host[name]
