"""The CUDA backend against a stand-in CuPy: how modules reach NVRTC and what is refused.

CuPy's RawModule appends -ftz=true to every compile (which flushes the binary32
subnormals the reference keeps), so the backend drives NVRTC itself; these tests
pin the options each build passes, the PTX report it keeps and what --strict-ptx
refuses, without a GPU.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from types import SimpleNamespace

import numpy as np
import pytest

import csa_conform.device.cuda as cuda
from csa_conform.device.kernels import LINE_INFO, STRICT_OPTIONS, KernelDirectory
from csa_conform.device.sanitizer import SANITIZER_ENV
from csa_conform.errors import DeviceUnavailable

CLEAN_PTX = ".version 8.0\n.visible .entry csa_ratio4_index_replicate(\n)\n{\n\tmul.rn.f32 \t%f1, %f2, %f3;\n}\n"


class FakeNvrtc:
    class NVRTCError(Exception):
        pass

    def __init__(self, ptx: str = CLEAN_PTX, fails: bool = False):
        self.ptx, self.fails = ptx, fails
        self.compiled: list[tuple[str, list[str]]] = []
        self.sources: list[str] = []
        self.destroyed = 0

    def createProgram(self, source, name, headers, include_names):
        self.compiled.append((name, []))
        self.sources.append(source)
        return len(self.compiled)

    def compileProgram(self, program, options):
        self.compiled[program - 1] = (self.compiled[program - 1][0], list(options))
        if self.fails:
            raise self.NVRTCError("NVRTC_ERROR_COMPILATION (6)")

    def getPTX(self, program):
        return self.ptx.encode() + b"\0"

    def getProgramLog(self, program):
        return "kernel.cu(3): error: expected a \";\""

    def destroyProgram(self, program):
        self.destroyed += 1

    @staticmethod
    def getVersion():
        return (13, 0)


class FakeDriverError(Exception):
    pass


class FakeModule:
    loaded: list[bytes] = []
    declared: dict[str, int] = {}  # the module globals every loaded module holds, by name

    def load(self, image: bytes):
        FakeModule.loaded.append(image)

    def get_function(self, name: str):
        return SimpleNamespace(name=name)

    def get_global_var(self, name: str):
        """cuModuleGetGlobal: the device address of a global (here the value's host buffer)."""
        if name not in FakeModule.declared:
            raise FakeDriverError("CUDA_ERROR_NOT_FOUND: named symbol not found")
        return np.array([FakeModule.declared[name]], np.int32)


def _memcpy(target: int, source: np.ndarray, size: int, kind: str) -> None:
    assert kind == "device to host"
    ctypes.memmove(target, source.ctypes.data, size)


def fake_cupy(nvrtc: FakeNvrtc, devices: int = 1):
    runtime = SimpleNamespace(
        getDeviceCount=lambda: devices,
        getDeviceProperties=lambda index: {"name": b"Fake H200", "major": 9, "minor": 0},
        runtimeGetVersion=lambda: 13020,
        driverGetVersion=lambda: 13000,
        memcpy=_memcpy,
        memcpyDeviceToHost="device to host",
    )
    return SimpleNamespace(
        __version__="fake",
        cuda=SimpleNamespace(
            runtime=runtime, nvrtc=nvrtc, function=SimpleNamespace(Module=FakeModule),
            driver=SimpleNamespace(CUDADriverError=FakeDriverError),
            Device=lambda: SimpleNamespace(id=0),
        ),
    )


@pytest.fixture
def install(monkeypatch):
    monkeypatch.setattr(cuda, "_COMPILED", {})
    monkeypatch.setattr(cuda, "initialised", False)

    def with_nvrtc(nvrtc: FakeNvrtc, devices: int = 1):
        monkeypatch.setitem(sys.modules, "cupy", fake_cupy(nvrtc, devices))
        return cuda.CudaBackend()

    return with_nvrtc


def test_modules_compile_without_flush_to_zero_for_the_device_arch(install):
    nvrtc = FakeNvrtc()
    backend = install(nvrtc)
    module = KernelDirectory().module("csa_ratio4_index_replicate")
    function = backend.function(module)
    assert function.name == "csa_ratio4_index_replicate"
    name, options = nvrtc.compiled[0]
    assert name == "csa_ratio4_index_replicate.cu"
    assert tuple(options) == STRICT_OPTIONS + ("--gpu-architecture=compute_90", LINE_INFO)
    assert "--ftz=false" in options and "-ftz=true" not in options and "--fmad=false" in options
    backend.function(module)
    assert len(nvrtc.compiled) == 1 and nvrtc.destroyed == 1
    assert backend.builds["csa_ratio4_index_replicate"].options == tuple(options)


class SideBySideNvrtc(FakeNvrtc):
    """Each compile waits until ``parties`` compiles are in flight: it passes only when they run side by side."""

    def __init__(self, parties: int):
        super().__init__()
        self.barrier, self.lock = threading.Barrier(parties, timeout=10), threading.Lock()

    def createProgram(self, *args):
        with self.lock:
            return super().createProgram(*args)

    def compileProgram(self, program, options):
        self.barrier.wait()
        with self.lock:
            super().compileProgram(program, options)


def test_a_steps_modules_compile_side_by_side_once_each(install, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    names = ("csa_ratio4_index_replicate", "csa_ratio4_index_select", "csa_ratio4_attention")
    nvrtc = SideBySideNvrtc(parties=len(names))
    backend = install(nvrtc)
    modules = [KernelDirectory().module(name) for name in names]
    backend.prebuild(modules + modules[:1])
    assert sorted(name for name, _ in nvrtc.compiled) == sorted(f"{name}.cu" for name in names)
    for module in modules:
        backend.function(module)
    backend.prebuild(modules)
    assert len(nvrtc.compiled) == len(names) and set(backend.builds) == set(names)


def test_repeated_runs_launch_staggered_builds_that_the_document_does_not_describe(install):
    """diff --repeat on CUDA: orders 1 and 2 compile the module behind the staggering header, once each (and
    side by side with the plain build when a step prebuilds them); the build the document reports stays the
    module as written."""
    nvrtc = FakeNvrtc()
    backend = install(nvrtc)
    module = KernelDirectory().module("csa_ratio4_index_select")
    backend.prebuild([module], (0, 1, 2))
    assert len(nvrtc.compiled) == 3
    plain = [source for source in nvrtc.sources if source == module.source]
    staggered = [source for source in nvrtc.sources if source != module.source]
    assert len(plain) == 1 and len(staggered) == 2
    for order, source in zip((1, 2), sorted(staggered, key=lambda text: f"{order_of(text)}")):
        assert order_of(source) == order and source.endswith("#line 1\n" + module.source)
    for order in (1, 2, 0):
        backend.schedule(order)
        backend.function(module)
    assert len(nvrtc.compiled) == 3
    assert backend.builds["csa_ratio4_index_select"].source_sha256 == module.sha256


def order_of(source: str) -> int:
    return int(source.split("const unsigned int place = ", 1)[1].split(" ", 1)[0])


def test_production_build_passes_only_the_architecture(install, tmp_path):
    """The CUDA provider's runtime: NVRTC with --gpu-architecture alone (line info adds no instruction)."""
    nvrtc = FakeNvrtc()
    backend = install(nvrtc)
    backend.function(KernelDirectory(build="production").module("csa_ratio4_index_replicate"))
    backend.function(KernelDirectory(build="production", nvrtc_options=("-DX=1",)).module("csa_ratio4_attention"))
    assert [options for _, options in nvrtc.compiled] == [
        ["--gpu-architecture=compute_90", LINE_INFO], ["-DX=1", "--gpu-architecture=compute_90", LINE_INFO],
    ]


@pytest.mark.parametrize("instruction, category", [
    ("mul.rn.ftz.f32", "ftz"), ("ex2.approx.f32", "approx"), ("fma.rn.f32", "fma.f32"), ("mad.f32", "fma.f32"),
])
def test_flagged_ptx_is_reported_and_refused_only_under_strict_ptx(install, instruction, category):
    ptx = CLEAN_PTX.replace("mul.rn.f32", instruction)
    backend = install(FakeNvrtc(ptx=ptx))
    backend.function(KernelDirectory().module("csa_ratio4_index_replicate"))
    report = backend.builds["csa_ratio4_index_replicate"].ptx
    assert report.flagged == [category] and report.total(category) == 1
    with pytest.raises(DeviceUnavailable, match=f"NVRTC emitted {category} .*--strict-ptx"):
        backend.function(KernelDirectory(strict_ptx=True).module("csa_ratio4_index_replicate"))


def test_a_declared_block_is_read_from_the_loaded_module_and_checked(install, monkeypatch):
    """Only a global the PTX declares is asked for: under compute-sanitizer a failing lookup is an error."""
    declaration = ".const .align 4 .u32 csa_block_csa_ratio4_sink_attention = 128;\n"
    backend = install(FakeNvrtc(ptx=declaration + CLEAN_PTX))
    monkeypatch.setattr(FakeModule, "declared", {"csa_block_csa_ratio4_sink_attention": 128})
    backend.function(KernelDirectory().module("csa_ratio4_attention"))
    assert backend.builds["csa_ratio4_attention"].block == 128
    assert backend.builds["csa_ratio4_attention"].to_dict()["declared_block"] == 128
    monkeypatch.setattr(FakeModule, "declared", {})  # a lookup of an undeclared symbol would now fail
    backend = install(FakeNvrtc())
    backend.function(KernelDirectory().module("csa_ratio4_index_replicate"))
    assert backend.builds["csa_ratio4_index_replicate"].block is None  # undeclared: the seed's shape
    monkeypatch.setattr(FakeModule, "declared", {"csa_block_csa_ratio4_sink_attention": 1025})
    monkeypatch.setattr(cuda, "_COMPILED", {})
    backend = install(FakeNvrtc(ptx=declaration + CLEAN_PTX))
    with pytest.raises(DeviceUnavailable, match="csa_block_csa_ratio4_sink_attention = 1025 is not a block size"):
        backend.function(KernelDirectory().module("csa_ratio4_attention"))


def test_compile_errors_carry_the_nvrtc_log(install):
    backend = install(FakeNvrtc(fails=True))
    with pytest.raises(DeviceUnavailable, match="(?s)cannot compile .*expected a"):
        backend.function(KernelDirectory().module("csa_ratio4_attention"))


def test_no_device_and_no_cupy_are_environment_errors(install, monkeypatch):
    with pytest.raises(DeviceUnavailable, match="no CUDA device"):
        install(FakeNvrtc(), devices=0)
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(DeviceUnavailable, match="CuPy is not importable"):
        cuda.CudaBackend()


def test_device_info(install):
    info = install(FakeNvrtc()).info()
    assert (info.name, info.compute_capability, info.cuda_runtime, info.cuda_driver, info.nvrtc) == (
        "Fake H200", "9.0", 13020, 13000, "13.0"
    )


@pytest.mark.parametrize("tool, poisoned, pool, guard", [("", True, True, cuda.GUARD_BYTES), ("memcheck", True, False, 0),
                                                         ("initcheck", False, False, cuda.GUARD_BYTES),
                                                         ("racecheck", True, False, cuda.GUARD_BYTES)])
def test_uninitialised_buffers_hold_0xa5_but_not_under_initcheck(monkeypatch, tool, poisoned, pool, guard):
    """A stand-in CuPy made of NumPy: what a buffer holds, whether the memory pool stays, and the guard
    on either side of each buffer (none under memcheck, which must see a write past the end; under the other tools
    such a write would land in the next allocation and change what the diff compares)."""
    allocations, allocators = [], []
    fake = fake_cupy(FakeNvrtc())
    fake.empty = lambda size, dtype: allocations.append(size) or np.zeros(size, dtype=dtype)
    fake.uint8 = np.uint8
    fake.cuda.set_allocator = allocators.append
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(cuda, "initialised", False)
    monkeypatch.setenv(SANITIZER_ENV, tool)
    backend = cuda.CudaBackend()
    buffer = backend.empty((2, 3), np.float32)
    assert (buffer.shape, buffer.dtype) == ((2, 3), np.float32)
    assert allocations == [2 * 3 * 4 + 2 * guard]
    assert (allocators == []) is pool
    assert set(buffer.view(np.uint8).reshape(-1).tolist()) == ({0xA5} if poisoned else {0})
    filled = backend.full((5,), -np.inf, np.float32)
    assert allocations[-1] == 5 * 4 + 2 * guard and filled.tolist() == [-np.inf] * 5
