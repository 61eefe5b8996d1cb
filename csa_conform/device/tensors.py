"""A step's named tensors, held on the host, the device or both.

Kernels want device buffers, host-oracle stages and payload comparison want
NumPy arrays, and a chained stream hands device buffers from one step to the
next. Each tensor is copied across on first need, once per step, so a stage
forced to the host costs one download and an all-host run never touches CUDA.

A record cache can be *reserved*: on the device it has a fixed number of
record rows per batch row (a stream's capacity, as a provider that replays
CUDA graphs reserves it once), on the host only the step's logical records.
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from csa_conform.spec import POISON


class StepTensors:
    """Tensors by name; ``backend`` is called only when a copy must cross.

    ``reserved`` maps a cache's name to (logical records, device records) of axis 1.
    """

    def __init__(self, backend: Callable[[], object], reserved: Mapping[str, tuple[int, int]] | None = None):
        self._backend = backend
        self._reserved = dict(reserved or {})
        self._host: dict[str, np.ndarray] = {}
        self._device: dict[str, object] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._host or name in self._device

    def put(self, name: str, value) -> None:
        self._host.pop(name, None)
        self._device.pop(name, None)
        if isinstance(value, np.ndarray) or np.isscalar(value):
            self._host[name] = np.asarray(value)
        else:
            self._device[name] = value

    def host(self, name: str) -> np.ndarray:
        if name not in self._host:
            array = self._backend().download(self._device[name])
            if name in self._reserved:
                array = np.ascontiguousarray(array[:, : self._reserved[name][0]])
            self._host[name] = array
        return self._host[name]

    def device(self, name: str):
        if name not in self._device:
            self._device[name] = self.upload(name, self._host[name])
        return self._device[name]

    def upload(self, name: str, array: np.ndarray):
        """``array`` on the device as tensor ``name`` would be there: a reserved cache padded with poison."""
        if name in self._reserved:
            rows = self._reserved[name][1]
            padded = np.empty((array.shape[0], rows) + array.shape[2:], array.dtype)
            padded.reshape(-1).view(np.uint8).fill(POISON)
            padded[:, : array.shape[1]] = array
            array = padded
        return self._backend().upload(array)

    def produced(self, name: str):
        """The tensor where it lives now (device array if it was made or copied there)."""
        return self._device[name] if name in self._device else self._host[name]
