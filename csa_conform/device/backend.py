"""The device runner's backend: what a step needs of a device, and the two that provide it.

A ``Backend`` compiles a kernel module (``function``), allocates buffers
(``upload``, ``empty``, ``poisoned``, ``full``), launches an entry and waits
for it (``launch``, which synchronises), updates buffers in place
(``copy_into``) and reads them back (``download``). ``info`` and ``builds``
describe the device and every module it built, for the run's provenance.

``cuda`` (csa_conform.device.cuda) runs on device 0 through CuPy and NVRTC.
``host`` (csa_conform.device.host) builds each module with g++ and runs it
on the CPU (what it is and is not: specs/host-backend.md), so a machine
without a GPU can still run every stage of its kernels. Depth checks that
need a real device (CUDA graph replay, explain's device libm) ask for the
optional ``capture`` / ``evaluate_libm`` and say so when a backend lacks them.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import numpy as np

from csa_conform.device.kernels import ModuleSource
from csa_conform.device.provenance import DeviceInfo, ModuleBuild
from csa_conform.errors import UsageError

CUDA = "cuda"
HOST = "host"
BACKENDS = (CUDA, HOST)


class Backend(Protocol):
    """The device operations a step runs through; buffers are opaque to the runner."""

    builds: dict[str, ModuleBuild]

    def info(self) -> DeviceInfo: ...

    def function(self, module: ModuleSource) -> Any:
        """Compile (once) and load a module; the handle ``launch`` takes."""

    def launch(self, entry: str, function: Any, grid: tuple[int, int, int], block: tuple[int, int, int],
               args: tuple[Any, ...]) -> None:
        """Run the entry over the grid and wait for it to finish."""

    def upload(self, array: np.ndarray) -> Any: ...

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """An uninitialised buffer (a fixed non-zero byte pattern, never zeros)."""

    def poisoned(self, shape: tuple[int, ...], dtype: Any, pattern: int) -> Any: ...

    def full(self, shape: tuple[int, ...], value: Any, dtype: Any) -> Any: ...

    def copy_into(self, target: Any, source: Any) -> None: ...

    def bind_probe_log(self, module: ModuleSource, function: Any, buffer: Any) -> bool:
        """Point a probed module's csa_probe_log at ``buffer`` (None: at nothing); False when it has none
        (csa_conform.device.probes)."""

    def download(self, array: Any) -> np.ndarray: ...


def backend_named(name: str) -> Callable[[], Backend]:
    """The constructor of a backend by name (``--backend``); nothing is imported or started yet. Its
    ``prepare``, where it has one, makes in the parent what the worker processes of an isolated runner
    (csa_conform.device.runner) share."""
    if name == CUDA:
        def cuda() -> Backend:
            from csa_conform.device.cuda import CudaBackend

            return CudaBackend()

        def forkable() -> bool:
            """A forked worker can launch only where this process has not initialised CUDA itself."""
            from csa_conform.device.cuda import initialised_here

            return not initialised_here()

        cuda.forkable = forkable  # type: ignore[attr-defined]
        return cuda
    if name == HOST:
        def host() -> Backend:
            from csa_conform.device.host import HostEmulationBackend

            return HostEmulationBackend()

        def prepare() -> None:
            """The build folder, made by the process that outlives the workers and removes it at exit."""
            from csa_conform.device.host.emulation import process_build_dir

            process_build_dir()

        host.prepare = prepare  # type: ignore[attr-defined]
        return host
    raise UsageError(f"backend {name!r} is not one of {', '.join(BACKENDS)}")
