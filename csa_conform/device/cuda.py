"""The only module that touches CuPy: device discovery, NVRTC modules, launches, copies.

CuPy is imported on first use, so everything else in csa-conform (and a run
whose every stage is forced to the host) works on a machine without CUDA.
Compiled modules are cached per process by the sha256 of their source.
"""

from __future__ import annotations

import numpy as np

from csa_conform.device.kernels import NVRTC_OPTIONS, ModuleSource
from csa_conform.device.provenance import DeviceInfo
from csa_conform.errors import DeviceUnavailable

_COMPILED: dict[str, object] = {}


def _import_cupy():
    try:
        import cupy
    except ImportError as error:
        raise DeviceUnavailable(
            f"CuPy is not importable ({error}); install the cuda extra (pip install 'csa-conform[cuda]') "
            "or force every stage to the host with --force-host all"
        ) from None
    return cupy


class CudaBackend:
    """Device 0 through CuPy; every CUDA failure surfaces as DeviceUnavailable."""

    def __init__(self):
        cupy = _import_cupy()
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as error:  # CUDARuntimeError, or a driver that cannot load
            raise DeviceUnavailable(f"no usable CUDA device: {error}") from None
        if count < 1:
            raise DeviceUnavailable("no CUDA device is visible (CUDA_VISIBLE_DEVICES?)")
        self.cp = cupy

    def info(self) -> DeviceInfo:
        runtime = self.cp.cuda.runtime
        properties = runtime.getDeviceProperties(self.cp.cuda.Device().id)
        name = properties["name"]
        major, minor = self.cp.cuda.Device().compute_capability
        nvrtc_major, nvrtc_minor = self.cp.cuda.nvrtc.getVersion()
        return DeviceInfo(
            name=name.decode() if isinstance(name, bytes) else str(name),
            compute_capability=f"{major}.{minor}",
            cuda_runtime=int(runtime.runtimeGetVersion()),
            cuda_driver=int(runtime.driverGetVersion()),
            nvrtc=f"{nvrtc_major}.{nvrtc_minor}",
            cupy=str(self.cp.__version__),
        )

    def function(self, module: ModuleSource):
        """The module's entry, compiled once per source hash."""
        key = module.sha256
        if key not in _COMPILED:
            try:
                raw = self.cp.RawModule(code=module.source, options=NVRTC_OPTIONS, name_expressions=None)
                raw.get_function(module.entry)
            except self.cp.cuda.compiler.CompileException as error:
                raise DeviceUnavailable(
                    f"NVRTC cannot compile {module.path} (prelude + module): {error}"
                ) from None
            except Exception as error:
                raise DeviceUnavailable(f"cannot load {module.entry} from {module.path}: {error}") from None
            _COMPILED[key] = raw
        return _COMPILED[key].get_function(module.entry)

    def launch(self, entry: str, function, grid: tuple[int, int, int], block: tuple[int, int, int], args: tuple):
        """Launch and wait, so a faulting kernel is reported at its own launch."""
        try:
            function(grid, block, args)
            self.cp.cuda.runtime.deviceSynchronize()
        except Exception as error:
            raise DeviceUnavailable(f"launch of {entry} (grid {grid}, block {block}) failed: {error}") from None

    def upload(self, array: np.ndarray):
        return self.cp.asarray(np.ascontiguousarray(array))

    def empty(self, shape, dtype):
        return self.cp.empty(shape, dtype=dtype)

    def full(self, shape, value, dtype):
        return self.cp.full(shape, value, dtype=dtype)

    def download(self, array) -> np.ndarray:
        return self.cp.asnumpy(array)

    def is_device_array(self, value) -> bool:
        return isinstance(value, self.cp.ndarray)
