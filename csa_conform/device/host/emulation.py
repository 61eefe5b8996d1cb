"""The host backend: every kernel module built with g++ and run on the CPU (``--backend host``).

``HostEmulationBackend`` has the CUDA backend's interface
(csa_conform.device.backend.Backend): each module is compiled as C++ with
the CUDA builtins it uses mapped onto standard C++ (cuda_host_shim.h) and
each launch runs its blocks one after another, the threads of a block as
fibers that take turns, in index order, at every __syncthreads()
(host_module.cpp). The module's NVRTC options map onto g++: --fmad=false is
-ffp-contract=off, --fmad=true (NVRTC's default, so the production build) is
-ffp-contract=fast -mfma, --ftz=true sets SSE's FTZ/DAZ bits around the
launch, -D and include paths pass through. What this is not (a GPU, a
race, the device's libm): specs/host-backend.md. ``build_prelude`` gives
ctypes access to the prelude's libm ports and block codecs.
"""

from __future__ import annotations

import ctypes
import hashlib
import mmap
import os
import shutil
import subprocess
from functools import cache
from pathlib import Path

import numpy as np

from csa_conform._base.scratch import scratch_folder
from csa_conform.device.guards import GUARD_BYTE
from csa_conform.device.kernels import KernelDirectory, ModuleSource
from csa_conform.device.probes import PROBE_SYMBOL
from csa_conform.device.provenance import DeviceInfo, ModuleBuild
from csa_conform.errors import DeviceUnavailable

HERE = Path(__file__).resolve().parent
GXX = shutil.which("g++")
GXX_FLAGS = ("-O2", "-std=c++17", "-fno-fast-math", "-fPIC", "-shared", "-w")
IGNORED = ("--prec-div=", "--prec-sqrt=", "--gpu-architecture=", "--generate-line-info", "-lineinfo", "--ftz=false")


def gxx_flags(options: tuple[str, ...]) -> tuple[tuple[str, ...], bool]:
    """(g++ flags, flush subnormals) for a module's NVRTC options; the last --fmad wins, as in NVRTC."""
    fmad = True
    flags: list[str] = []
    ftz = False
    for option in options:
        if option.startswith("--fmad="):
            fmad = option == "--fmad=true"
        elif option == "--ftz=true":
            ftz = True
        elif option.startswith(("-D", "-I")):
            flags.append(option)
        elif option.startswith(("--define-macro=", "--include-path=")):
            flags.append(("-D" if option.startswith("--define") else "-I") + option.split("=", 1)[1])
        elif not option.startswith(IGNORED):
            raise DeviceUnavailable(f"the host backend cannot build with the NVRTC option {option}")
    contraction = ("-ffp-contract=fast", "-mfma") if fmad else ("-ffp-contract=off",)
    return contraction + tuple(flags), ftz


def _build(source: str, wrapper: str, build_dir: Path, flags: tuple[str, ...] = ("-ffp-contract=off",),
           headers: tuple[str, ...] | None = None) -> ctypes.CDLL:
    """The library of one source, wrapper and flags, built once per build folder. Its files appear
    whole (written under a name of this process, then renamed), so processes may share a folder.
    ``headers``: the flags host_headers.h is precompiled with for this build (None: not precompiled)."""
    digest = hashlib.sha256((wrapper + "\0" + " ".join(flags) + "\0" + source).encode()).hexdigest()[:24]
    library = build_dir / f"{digest}.so"
    if not library.exists():
        source_file = build_dir / f"{digest}.cuh"
        _publish(source_file, lambda path: path.write_text(source, encoding="utf-8"))
        include = () if headers is None else ("-include", str(_precompiled_headers(build_dir, headers)))
        _publish(library, lambda path: _compile(wrapper, source_file, flags + include, path))
    return ctypes.CDLL(str(library))


def _precompiled_headers(build_dir: Path, flags: tuple[str, ...]) -> Path:
    """A copy of host_headers.h in the build folder with its .gch for these flags beside it, made once per
    folder: parsing those headers is a fifth of a module's build. The library is the same byte for byte;
    g++ parses the copy's text instead where it cannot use the .gch (or none could be made)."""
    text = (HERE / "host_headers.h").read_text(encoding="utf-8")
    digest = hashlib.sha256((" ".join(flags) + "\0" + text).encode()).hexdigest()[:24]
    header = build_dir / f"headers-{digest}.h"
    if not header.exists():
        precompiled = header.with_name(f"{header.name}.gch")
        partial = precompiled.with_name(f"{precompiled.name}.{os.getpid()}.partial")
        try:
            command = [GXX, *GXX_FLAGS, *flags, f"-I{HERE}", "-x", "c++-header", str(HERE / "host_headers.h"),
                       "-o", str(partial)]
            if subprocess.run(command, capture_output=True).returncode == 0:
                os.replace(partial, precompiled)
        finally:
            partial.unlink(missing_ok=True)
        _publish(header, lambda path: path.write_text(text, encoding="utf-8"))
    return header


def _publish(path: Path, write) -> None:
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        write(partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def _compile(wrapper: str, source_file: Path, flags: tuple[str, ...], library: Path) -> None:
    command = [
        GXX, *GXX_FLAGS, *flags, f"-I{HERE}", f'-DCSA_SOURCE="{source_file}"', str(HERE / wrapper), "-o", str(library),
    ]
    built = subprocess.run(command, capture_output=True, text=True)
    if built.returncode != 0:
        log = built.stderr.strip().splitlines()
        raise DeviceUnavailable(f"g++ cannot build {wrapper} for the host backend: "
                                f"{log[0] if log else 'exit ' + str(built.returncode)}")


def build_prelude(build_dir: Path, kernels: KernelDirectory | None = None) -> ctypes.CDLL:
    kernels = kernels or KernelDirectory()
    source = (kernels.path / "block_quant.cuh").read_text(encoding="utf-8")
    return _build(source, "host_prelude.cpp", build_dir)


# Bytes before and after every emulated buffer, filled with GUARD_BYTE: a kernel writing just outside it
# (what compute-sanitizer's memcheck reports on a GPU) lands there instead of in the host heap, and the
# runner sees it (csa_conform.device.guards). 64 keeps the buffer as aligned as the allocation.
GUARD_BYTES = 64
PAGE = mmap.PAGESIZE


@cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return libc


def _inaccessible(address: int) -> None:
    if _libc().mprotect(address, PAGE, 0) != 0:
        raise DeviceUnavailable("the host backend cannot protect the pages around its buffers")


def _guarded(shape, dtype) -> tuple[np.ndarray, np.ndarray]:
    """(the buffer, its allocation: the buffer with a band before it and one after it to the page's end).

    The allocation is a mapping of its own between two inaccessible pages: a write farther out than a band
    faults in the launch that made it (the case's verdict, ``fault``) where, in the heap, it would corrupt
    the worker's memory and kill it later, outside any launch, with no case to blame.
    """
    dtype = np.dtype(dtype)
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    span = -(-(GUARD_BYTES + size + GUARD_BYTES) // PAGE) * PAGE
    try:
        mapping = mmap.mmap(-1, PAGE + span + PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError as error:
        raise MemoryError(f"cannot map {PAGE + span + PAGE} bytes ({error.strerror})") from None
    whole = np.frombuffer(mapping, np.uint8)
    _inaccessible(whole.ctypes.data)
    _inaccessible(whole.ctypes.data + PAGE + span)
    raw = whole[PAGE: PAGE + span]
    raw[:GUARD_BYTES] = GUARD_BYTE
    raw[GUARD_BYTES + size:] = GUARD_BYTE
    return raw[GUARD_BYTES: GUARD_BYTES + size].view(dtype).reshape(shape), raw


def _slot_bits(arg) -> int:
    """An argument as the 8 bytes of its slot: a buffer's address, an i64, a binary32, else an i32."""
    if isinstance(arg, EmulatedArray):
        return arg.address
    if isinstance(arg, np.int64):
        return int(arg) & 0xFFFF_FFFF_FFFF_FFFF
    if isinstance(arg, np.float32):
        return int(np.float32(arg).view(np.uint32))
    return int(arg) & 0xFFFF_FFFF


class EmulatedArray:
    """A 'device' buffer: host memory the runner cannot mistake for a host tensor, with a guard band on
    either side."""

    def __init__(self, array: np.ndarray):
        array = np.asarray(array)
        self.array, self.allocation = _guarded(array.shape, array.dtype)
        self.array[...] = array

    @property
    def address(self) -> int:
        """Where the kernel sees the buffer start: after the band before it, even with no elements (NumPy
        puts an empty view at the start of its base)."""
        return self.allocation.ctypes.data + GUARD_BYTES

    shape = property(lambda self: self.array.shape)
    ndim = property(lambda self: self.array.ndim)
    size = property(lambda self: self.array.size)
    dtype = property(lambda self: self.array.dtype)


# Each thread of a multi-thread block runs on its own stack: STACK_BYTES above an inaccessible page.
STACK_BYTES = 512 * 1024
STACK_STRIDE = PAGE + STACK_BYTES


@cache
def thread_stacks(threads: int) -> int:
    """The address of stacks for ``threads`` fibers, mapped once per process and block width and shared
    by every module (mappings per module would exhaust the process's mapping count)."""
    libc = _libc()
    read_write, private_anonymous_unreserved = 0x1 | 0x2, 0x02 | 0x20 | 0x4000
    base = libc.mmap(None, threads * STACK_STRIDE, read_write, private_anonymous_unreserved, -1, 0)
    if base in (None, ctypes.c_void_p(-1).value):
        raise DeviceUnavailable(f"the host backend cannot map stacks for {threads} threads per block")
    for thread in range(threads):
        if libc.mprotect(base + thread * STACK_STRIDE, PAGE, 0) != 0:
            raise DeviceUnavailable(f"the host backend cannot protect the stacks of {threads} threads per block")
    return base


@cache
def process_build_dir() -> Path:
    """Where this process builds host modules (once per source and flags); removed when it exits."""
    return scratch_folder("csa-conform-host-")


class HostEmulationBackend:
    """The CUDA backend's interface, executing modules on the CPU."""

    in_process = True  # its kernels run in this process's memory, and can write anywhere in it

    def __init__(self, build_dir: Path | None = None):
        if GXX is None:
            raise DeviceUnavailable("the host backend needs g++ (install it, or use --backend cuda on a GPU machine)")
        self.build_dir = Path(build_dir) if build_dir is not None else process_build_dir()
        self.launches = 0
        self.builds: dict[str, ModuleBuild] = {}
        self.reversed = False

    def schedule(self, order: int) -> None:
        """In order 1 (``diff --repeat``'s even runs) run the next launches' blocks, and each block's threads
        between barriers, from the last down: a missing barrier whose race only a later thread running first
        shows becomes a difference between runs. Order 2 is index order, as the first run's."""
        self.reversed = order == 1

    def info(self) -> DeviceInfo:
        return DeviceInfo(name="host emulation (g++)", compute_capability="host")

    def function(self, module: ModuleSource):
        options = module.build.nvrtc_options("host")
        flags, ftz = gxx_flags(options)
        library = _build(module.source, "host_module.cpp", self.build_dir, flags + (f"-DCSA_ENTRY={module.entry}",),
                         headers=flags)
        try:
            declared = ctypes.c_int.in_dll(library, module.block_symbol).value
        except ValueError:  # no such symbol: the seed's launch shape
            declared = None
        self.builds[module.module] = ModuleBuild(module.module, module.sha256, options, None,
                                                 module.declared_block(declared))
        return library, ftz

    def bind_probe_log(self, module: ModuleSource, function, buffer) -> bool:
        """Point the library's csa_probe_log at ``buffer`` (None: at nothing); False when it has none."""
        library, _ = function
        try:
            pointer = ctypes.c_void_p.in_dll(library, PROBE_SYMBOL)
        except ValueError:
            return False
        pointer.value = None if buffer is None else buffer.array.ctypes.data
        return True

    def launch(self, entry, function, grid, block, args) -> None:
        library, ftz = function
        slots = (ctypes.c_uint64 * max(1, len(args)))()
        for position, arg in enumerate(args):
            slots[position] = _slot_bits(arg)
        base = ctypes.addressof(slots)
        pointers = (ctypes.c_void_p * max(1, len(args)))(*(base + 8 * position for position in range(len(args))))
        stacks = thread_stacks(block[0]) if block[0] > 1 else 0
        library.csa_host_flush_subnormals.restype = ctypes.c_uint
        previous = library.csa_host_flush_subnormals(int(ftz))
        try:
            library.csa_host_launch(ctypes.c_uint(grid[0]), ctypes.c_uint(block[0]), pointers,
                                    ctypes.c_void_p(stacks), ctypes.c_size_t(STACK_STRIDE), ctypes.c_int(self.reversed))
        finally:
            library.csa_host_restore_mxcsr(ctypes.c_uint(previous))
        self.launches += 1

    def copy_into(self, target, source) -> None:
        target.array[...] = source.array

    def upload(self, array):
        return EmulatedArray(array)

    def empty(self, shape, dtype):
        """Uninitialised like the CUDA backend's device memory: 0xA5 bytes."""
        return self.poisoned(shape, dtype, 0xA5)

    def poisoned(self, shape, dtype, pattern: int):
        array = np.empty(shape, dtype=dtype)
        array.reshape(-1).view(np.uint8)[:] = pattern
        return EmulatedArray(array)

    def full(self, shape, value, dtype):
        return EmulatedArray(np.full(shape, value, dtype=dtype))

    def download(self, array) -> np.ndarray:
        return array.array.copy()

    def guard_bands(self, array) -> tuple[np.ndarray, np.ndarray, int]:
        """(the band before, the band after, the buffer's size in bytes) as they are now."""
        raw, size = array.allocation, array.array.nbytes
        return raw[:GUARD_BYTES].copy(), raw[GUARD_BYTES + size:].copy(), size

    def restore_guard_bands(self, array, byte: int) -> None:
        array.allocation[:GUARD_BYTES] = byte
        array.allocation[GUARD_BYTES + array.array.nbytes:] = byte
