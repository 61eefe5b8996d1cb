"""The only module that touches CuPy: device discovery, NVRTC modules, launches, copies.

CuPy is imported on first use, so everything else in csa-conform (and a run
whose every stage is forced to the host) works on a machine without CUDA.
Modules go through NVRTC directly (not RawModule, whose compile forces
-ftz=true) with their build's options plus line info, a step's modules side by
side; they are cached per process by the sha256 of their source and the
options, and get a PTX report (flush-to-zero, approximate and fused binary32
instructions, library vs own lines).
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import numpy as np

from csa_conform.device.guards import GUARD_BYTE
from csa_conform.device.kernels import Build, ModuleSource
from csa_conform.device.probes import PROBE_SYMBOL
from csa_conform.device.provenance import DeviceInfo, ModuleBuild
from csa_conform.device.ptx import analyse
from csa_conform.device.sanitizer import INITCHECK, MEMCHECK, SANITIZER_ENV
from csa_conform.device.schedule import staggered
from csa_conform._base.statuses import FAULT, HANG
from csa_conform.errors import DeviceUnavailable, KernelFault
from csa_conform.spec import POISON

_COMPILED: dict[str, tuple[object, ModuleBuild]] = {}
_PROBED: dict[str, bool] = {}  # compiled key -> whether its PTX declares csa_probe_log
initialised = False  # whether this process has a CUDA context (a fork of it could not use CUDA)
CUDA_ERROR_NOT_INITIALIZED = 3


def initialised_here() -> bool:
    """Whether this process has initialised CUDA, by csa-conform's backend or by anything else it hosts (CuPy,
    PyTorch: a pytest session's other tests): a forked child could not use the device then. The driver is
    asked without initialising it; no driver, no CUDA."""
    if initialised:
        return True
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    count = ctypes.c_int()
    return driver.cuDeviceGetCount(ctypes.byref(count)) != CUDA_ERROR_NOT_INITIALIZED

GUARD_BYTES = 256

# explain's probe: CUDA's own libm function on given binary32 arguments, one thread each.
LIBM_PROBE = """extern "C" __global__ void csa_libm_probe(const float* x, const float* y, float* out, long long n)
{
    const long long i = threadIdx.x + (long long)blockDim.x * blockIdx.x;
    if (i < n) out[i] = %s;
}
"""
LIBM_CALLS = {"expf": "expf(x[i])", "exp2f": "exp2f(x[i])", "sinf": "sinf(x[i])", "cosf": "cosf(x[i])",
              "log2f": "log2f(x[i])", "powf": "powf(x[i], y[i])",
              # what a kernel writing (float)exp((double)x) gets: CUDA's double function, rounded once
              "expf-double": "(float)exp((double)x[i])", "sinf-double": "(float)sin((double)x[i])",
              "cosf-double": "(float)cos((double)x[i])", "log2f-double": "(float)log2((double)x[i])",
              "powf-double": "(float)pow((double)x[i], (double)y[i])"}


# The errors a kernel leaves its context with ("sticky": every later call of the process fails too), in the
# driver's and the runtime's spelling; a launch the watchdog stopped is a hang, the others are faults.
STICKY = {"ILLEGAL_ADDRESS": "IllegalAddress", "MISALIGNED_ADDRESS": "MisalignedAddress",
          "ILLEGAL_INSTRUCTION": "IllegalInstruction", "ASSERT": "Assert", "HARDWARE_STACK_ERROR": "HardwareStackError",
          "INVALID_PC": "InvalidPc", "INVALID_ADDRESS_SPACE": "InvalidAddressSpace", "LAUNCH_FAILED": "LaunchFailure",
          "LAUNCH_TIMEOUT": "LaunchTimeout"}
_STICKY_NAMES = {name: driver for driver, runtime in STICKY.items()
                 for name in (f"CUDA_ERROR_{driver}", f"cudaError{runtime}")}


def sticky_error(error: BaseException) -> str | None:
    """The CUDA error name when ``error`` is one that kills the context (CuPy puts it first in the message)."""
    name = re.split(r"[:\s]", str(error).strip(), maxsplit=1)[0]
    return name if name in _STICKY_NAMES else None


def _raise_sticky(error: BaseException) -> None:
    """A sticky error as the kernel's KernelFault (or, the watchdog's, hang); this process's context is dead."""
    name = sticky_error(error)
    if name is not None:
        raise KernelFault(HANG if _STICKY_NAMES[name] == "LAUNCH_TIMEOUT" else FAULT, name, ends_worker=True) from None


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

    def __init__(self) -> None:
        cupy = _import_cupy()
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as error:  # CUDARuntimeError, or a driver that cannot load
            raise DeviceUnavailable(f"no usable CUDA device: {error}") from None
        if count < 1:
            raise DeviceUnavailable("no CUDA device is visible (CUDA_VISIBLE_DEVICES?)")
        global initialised
        initialised = True
        self.sanitizer = os.environ.get(SANITIZER_ENV, "")
        if self.sanitizer:
            cupy.cuda.set_allocator(None)  # every buffer its own allocation, as compute-sanitizer must see it
        self.cp = cupy
        self.builds: dict[str, ModuleBuild] = {}
        self._architecture: str | None = None
        self.order = 0
        self._staggered: dict[tuple[str, int], ModuleSource] = {}

    def schedule(self, order: int) -> None:
        """Launch the next entries from builds whose warps leave each barrier staggered in ``order``
        (csa_conform.device.schedule; 0: the module as built), for ``diff --repeat``'s later runs."""
        self.order = order

    def _in_order(self, module: ModuleSource, order: int) -> ModuleSource:
        """The module as ``order`` launches it: as written (0), or its staggered build's source, made once."""
        if not order:
            return module
        key = (module.sha256, order)
        if key not in self._staggered:
            self._staggered[key] = staggered(module, order)
        return self._staggered[key]

    def info(self) -> DeviceInfo:
        runtime = self.cp.cuda.runtime
        properties = runtime.getDeviceProperties(self.cp.cuda.Device().id)
        name = properties["name"]
        nvrtc_major, nvrtc_minor = self.cp.cuda.nvrtc.getVersion()
        return DeviceInfo(
            name=name.decode() if isinstance(name, bytes) else str(name),
            compute_capability=f"{properties['major']}.{properties['minor']}",
            cuda_runtime=int(runtime.runtimeGetVersion()),
            cuda_driver=int(runtime.driverGetVersion()),
            nvrtc=f"{nvrtc_major}.{nvrtc_minor}",
            cupy=str(self.cp.__version__),
        )

    def architecture(self) -> str:
        """The device's virtual architecture, asked once (every compile option set and module key needs it)."""
        if self._architecture is None:
            properties = self.cp.cuda.runtime.getDeviceProperties(self.cp.cuda.Device().id)
            self._architecture = f"compute_{properties['major']}{properties['minor']}"
        return self._architecture

    def compile_options(self, module: ModuleSource) -> tuple[str, ...]:
        """NVRTC options as given: the module's build and the device's virtual architecture."""
        return module.build.nvrtc_options(self.architecture())

    def function(self, module: ModuleSource):
        """The module's entry, compiled once per source hash and option set.

        NVRTC is called directly: CuPy's RawModule appends -ftz=true to every
        compile, which flushes the binary32 subnormals the reference keeps. The
        PTX report is kept in self.builds; with --strict-ptx a module whose PTX
        flushes, approximates or fuses binary32 is refused before its entry is
        handed out.
        """
        module = self._in_order(module, self.order)
        options = self.compile_options(module)
        key = module.sha256 + " " + " ".join(options)
        if key not in _COMPILED:
            self._load(module, options, key, self._compile(module, options))
        loaded, build = _COMPILED[key]
        if not self.order:  # a staggered build is a depth mode's, not the one the document describes
            self.builds[module.module] = build
        if module.build.strict_ptx and build.ptx.flagged:
            raise DeviceUnavailable(f"{module.path}: NVRTC emitted {', '.join(build.ptx.flagged)} instructions "
                                    f"({build.ptx.summary()}) with {' '.join(options)} (--strict-ptx)")
        try:
            return loaded.get_function(module.entry)
        except Exception as error:
            raise DeviceUnavailable(f"{module.path} has no entry {module.entry}: {error}") from None

    def prebuild(self, modules: list[ModuleSource], orders: tuple[int, ...] = (0,)) -> None:
        """The modules a step launches, compiled side by side before its first launch: NVRTC releases the GIL,
        so a directory builds in the time of its slowest module, not of all of them in a row (a cold
        ``diff --explain`` builds the directory twice, plain and probed; ``--repeat`` builds the staggered
        ``orders`` too). Loading stays one module at a time."""
        pending = {}
        for module in (self._in_order(module, order) for order in orders for module in modules):
            options = self.compile_options(module)
            pending.setdefault(module.sha256 + " " + " ".join(options), (module, options))
        pending = {key: item for key, item in pending.items() if key not in _COMPILED}
        if len(pending) < 2:
            return
        with ThreadPoolExecutor(min(len(pending), os.cpu_count() or 1)) as pool:
            ptx = dict(zip(pending, pool.map(lambda item: self._compile(*item), pending.values())))
        for key, (module, options) in pending.items():
            self._load(module, options, key, ptx[key])

    def _load(self, module: ModuleSource, options: tuple[str, ...], key: str, ptx: str) -> None:
        report = analyse(module.module, ptx, module.source, module.locate, module.path.name)
        loaded = self.cp.cuda.function.Module()
        try:
            loaded.load(ptx.encode())
        except Exception as error:
            raise DeviceUnavailable(f"the driver cannot load the PTX of {module.path}: {error}") from None
        _COMPILED[key] = loaded, ModuleBuild(module.module, module.sha256, options, report,
                                             module.declared_block(self._declared(loaded, module, ptx)))
        _PROBED[key] = _declares(ptx, PROBE_SYMBOL)

    def _declared(self, loaded, module: ModuleSource, ptx: str) -> int | None:
        """The module's ``csa_block_<entry>`` (a __constant__ int), None when its PTX declares none.

        The loaded module is asked only for a global its PTX declares: a failing driver call
        (CUDA_ERROR_NOT_FOUND) is an error compute-sanitizer reports for every undeclared module.
        """
        if not _declares(ptx, module.block_symbol):
            return None
        try:
            pointer = loaded.get_global_var(module.block_symbol)
        except self.cp.cuda.driver.CUDADriverError as error:
            raise DeviceUnavailable(f"{module.path}: cannot read {module.block_symbol}: {error}") from None
        value = np.zeros(1, np.int32)
        runtime = self.cp.cuda.runtime
        runtime.memcpy(value.ctypes.data, pointer, value.nbytes, runtime.memcpyDeviceToHost)
        return int(value[0])

    def bind_probe_log(self, module: ModuleSource, function, buffer) -> bool:
        """Point the module's csa_probe_log at ``buffer`` (None: at nothing); False when it declares none."""
        key = module.sha256 + " " + " ".join(self.compile_options(module))
        if not _PROBED.get(key):
            return False
        loaded, _ = _COMPILED[key]
        try:
            pointer = loaded.get_global_var(PROBE_SYMBOL)
        except self.cp.cuda.driver.CUDADriverError as error:
            raise DeviceUnavailable(f"{module.path}: cannot set {PROBE_SYMBOL}: {error}") from None
        value = np.array([0 if buffer is None else buffer.data.ptr], dtype=np.uint64)
        runtime = self.cp.cuda.runtime
        runtime.memcpy(pointer, value.ctypes.data, value.nbytes, runtime.memcpyHostToDevice)
        return True

    def _compile(self, module: ModuleSource, options: tuple[str, ...]) -> str:
        nvrtc = self.cp.cuda.nvrtc
        try:
            program = nvrtc.createProgram(module.source, module.path.name, (), ())
        except Exception as error:
            raise DeviceUnavailable(f"NVRTC is unusable through CuPy {self.cp.__version__}: {error}") from None
        try:
            nvrtc.compileProgram(program, list(options))
            ptx = nvrtc.getPTX(program)
        except nvrtc.NVRTCError as error:
            log = nvrtc.getProgramLog(program)
            raise DeviceUnavailable(f"NVRTC cannot compile {module.path} (prelude + module): {error}\n{log}") from None
        finally:
            nvrtc.destroyProgram(program)
        return ptx.decode() if isinstance(ptx, bytes) else ptx

    def evaluate_libm(self, name: str, args: tuple, build: Build) -> np.ndarray:
        """CUDA's `name` on the arguments (broadcast binary32 arrays), compiled with `build`'s options."""
        probe = ModuleSource(f"libm_probe_{name}", "csa_libm_probe", Path(f"csa_libm_probe_{name}.cu"),
                             LIBM_PROBE % LIBM_CALLS[name], dataclasses.replace(build, strict_ptx=False))
        function = self.function(probe)
        arrays = np.broadcast_arrays(*(np.asarray(arg, dtype=np.float32) for arg in args))
        x = self.upload(arrays[0].ravel())
        y = self.upload((arrays[1] if len(arrays) > 1 else arrays[0]).ravel())
        out = self.empty(x.shape, np.float32)
        count = int(x.size)
        if count:
            self.launch(probe.entry, function, ((count + 255) // 256, 1, 1), (256, 1, 1), (x, y, out, np.int64(count)))
        return self.download(out).reshape(arrays[0].shape)

    def launch(self, entry: str, function, grid: tuple[int, int, int], block: tuple[int, int, int], args: tuple):
        """Launch and wait, so a faulting kernel is reported at its own launch: a sticky error is the kernel's
        KernelFault (this process's context is dead: it ends the worker), any other the environment's."""
        try:
            function(grid, block, args)
            self.cp.cuda.runtime.deviceSynchronize()
        except Exception as error:
            _raise_sticky(error)
            raise DeviceUnavailable(f"launch of {entry} (grid {grid}, block {block}) failed: {error}") from None

    def copy_into(self, target, source) -> None:
        """Update a buffer in place (a graph's input), from another device buffer."""
        target[...] = source

    def capture(self, launches) -> Callable[[], None]:
        """The launches captured into a CUDA graph on a stream of their own; the result replays it.

        Every module is loaded and every buffer allocated already (the eager step
        did both), so the capture records kernels only; a replay waits for the
        in-place input updates on the default stream and for itself.
        """
        stream = self.cp.cuda.Stream(non_blocking=True)
        try:
            with stream:
                stream.begin_capture()
                try:
                    for launch in launches:
                        launch.function(launch.grid, launch.block, launch.args)
                finally:
                    graph = stream.end_capture()
        except Exception as error:
            raise DeviceUnavailable(f"CUDA graph capture failed: {error}") from None

        def replay() -> None:
            try:
                self.cp.cuda.runtime.deviceSynchronize()
                graph.launch(stream)
                stream.synchronize()
            except Exception as error:
                _raise_sticky(error)
                raise DeviceUnavailable(f"CUDA graph replay failed: {error}") from None

        return replay

    def upload(self, array: np.ndarray):
        return self.cp.asarray(np.ascontiguousarray(array))

    def empty(self, shape, dtype):
        if self.sanitizer == INITCHECK:
            return self._guarded(shape, dtype)  # left uninitialised for initcheck to watch
        return self.poisoned(shape, dtype, POISON)

    def poisoned(self, shape, dtype, pattern: int):
        """A buffer whose every byte is ``pattern``, filled on the device."""
        buffer = self._guarded(shape, dtype)
        buffer.view(self.cp.uint8).fill(pattern)
        return buffer

    def full(self, shape, value, dtype):
        buffer = self._guarded(shape, dtype)
        buffer.fill(value)
        return buffer

    def _guarded(self, shape, dtype):
        """A buffer a kernel writes, with GUARD_BYTES of its own allocation on either side, filled with
        GUARD_BYTE and checked after each launch (csa_conform.device.guards).

        A write just outside (an off-by-one kernel) lands there instead of in another
        buffer or unmapped memory, where it would change a result the diff compares
        or kill the CUDA context for the rest of the run. Under memcheck every buffer
        is exactly its size, so memcheck reports that write; the other tools keep the
        bands, since there the write would land in whichever allocation follows
        (buffers are allocated one by one). Under initcheck only the bands are filled.
        """
        dtype = np.dtype(dtype)
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        guard = 0 if self.sanitizer == MEMCHECK else GUARD_BYTES
        raw = self.cp.empty(guard + size + guard, dtype=self.cp.uint8)
        if guard:
            raw[:guard].fill(GUARD_BYTE)
            raw[guard + size:].fill(GUARD_BYTE)
        return raw[guard: guard + size].view(dtype).reshape(shape)

    def _bands(self, buffer):
        """The two bands of a buffer ``_guarded`` made, as device arrays over its allocation."""
        before = self.cp.ndarray((GUARD_BYTES,), self.cp.uint8, memptr=buffer.data - GUARD_BYTES)
        after = self.cp.ndarray((GUARD_BYTES,), self.cp.uint8, memptr=buffer.data + buffer.nbytes)
        return before, after

    def guard_bands(self, buffer):
        """(the band before, the band after, the buffer's size in bytes); None under memcheck (no bands) and
        for a buffer of no bytes (a cache before its first record), whose view CuPy need not place in its
        allocation."""
        if self.sanitizer == MEMCHECK or buffer.nbytes == 0:
            return None
        before, after = self._bands(buffer)
        return self.cp.asnumpy(before), self.cp.asnumpy(after), int(buffer.nbytes)

    def restore_guard_bands(self, buffer, byte: int) -> None:
        if self.sanitizer == MEMCHECK or buffer.nbytes == 0:
            return
        for band in self._bands(buffer):
            band.fill(byte)

    def download(self, array) -> np.ndarray:
        return self.cp.asnumpy(array)


def _declares(ptx: str, symbol: str) -> bool:
    """Whether the PTX declares a global or constant named ``symbol`` (asking the driver for one it does not
    declare is an error compute-sanitizer reports)."""
    return re.search(r"^\s*(?:\.\w+\s+)*\.(?:const|global)\s[^;]*\b" + re.escape(symbol) + r"\b", ptx, re.M) is not None
