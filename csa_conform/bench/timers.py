"""Timers: how one repetition of a row's launches is timed on each backend, and the SM clock it ran at.

``CudaTimer`` (the cuda backend): CUDA events on a stream of its own, the
stream held by a blocking kernel (it spins on a flag in mapped host memory)
until every launch of the repetition and the end event are queued, so the
start event does not run ahead of a launch still being issued. Cold samples
first reset the persisting L2 lines (cudaCtxResetPersistingL2Cache: CuPy's
runtime module where it has it, else the driver's cuCtxResetPersistingL2Cache
through ctypes, else none, as the section's ``persisting_l2`` says), so no
line a kernel marked persisting survives the flush, then overwrite an L2
flush buffer (twice the L2's size, at least 64 MiB). Hot samples rotate their
inputs instead (csa_conform.bench.rotation), over copies holding twice the L2.
The SM clock and temperature come from NVML (libnvidia-ml.so.1 through
ctypes, when present) after each repetition. A step is timed as one CUDA
graph of its launches. Any CUDA error of a timed launch is DeviceUnavailable
(exit 4), never a time.

``CuptiTimer`` (the cuda backend's default where libcupti loads and starts,
``--timer auto|cupti|events``): the same repetition, held and flushed alike,
timed by CUPTI's kernel activity records instead of events: the last end
minus the first start of the repetition's own kernels, told apart from the
hold kernel, the poison and the L2 flush by stream and correlation id
(csa_conform.bench.cupti). A record count that does not match the launches,
or a record without timestamps, is DeviceUnavailable, never a time. The
measured peaks stay timed by events. Where CUPTI cannot be used, ``auto``
falls back to ``CudaTimer`` and keeps the reason (``fallback``).

``HostTimer`` (``--backend host``): the emulated launches timed with
perf_counter, a 32 MiB buffer rewritten for cold samples (hot samples rotate
inputs over twice its half, a notional 16 MiB cache); no clock. Its timings
are labelled "host timings: not a device measurement".
"""

from __future__ import annotations

import ctypes
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from csa_conform.bench.cupti import Activity, open_activity, repetition_records, repetition_seconds
from csa_conform.bench.samples import Reading
from csa_conform.bench.trust import Guard
from csa_conform.device.kernels import Build, ModuleSource
from csa_conform.device.recorder import RecordedLaunch
from csa_conform.errors import DeviceUnavailable, UsageError

HOST_CAVEAT = "host timings: not a device measurement"
HOLD_TIMEOUT_NS = 2_000_000_000
HOLD_ENTRY = "csa_bench_hold"
HOST_ALLOC_MAPPED = 0x02  # cudaHostAllocMapped
NVML_CLOCK_SM = 1
NVML_TEMPERATURE_GPU = 0
NVML_SUCCESS = 0
CUDA_SUCCESS = 0
HOST_FLUSH_BYTES = 32 << 20
MIN_FLUSH_BYTES = 64 << 20

UTILITIES = r"""
extern "C" __global__ void csa_bench_hold(volatile const int* release, unsigned long long timeout_ns)
{
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        if (*release != 0) return;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < timeout_ns);
}

extern "C" __global__ void csa_bench_copy(const float4* source, float4* target, long long count)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) target[i] = source[i];
}

extern "C" __global__ void csa_bench_fma(float* out, int iterations, float a, float b)
{
    float x[8];
    for (int k = 0; k < 8; ++k) x[k] = (float)(threadIdx.x + k);
    for (int i = 0; i < iterations; ++i)
        for (int k = 0; k < 8; ++k) x[k] = fmaf(x[k], a, b);
    float sum = 0.0f;
    for (int k = 0; k < 8; ++k) sum += x[k];
    out[(long long)blockIdx.x * blockDim.x + threadIdx.x] = sum;
}
"""
UTILITY_BUILD = Build("production", ("--fmad=true",), "csa-conform bench utilities")
FMA_ITERATIONS = 4096
FMA_CHAINS = 8
COPY_BYTES = 256 << 20
PEAK_REPEATS = 5


class Nvml:
    """The SM clock, its maximum and the temperature of one GPU, read through libnvidia-ml.so.1."""

    def __init__(self, library: ctypes.CDLL, handle: ctypes.c_void_p):
        self.library = library
        self.handle = handle

    @classmethod
    def open(cls, pci_bus_id: str | None) -> Nvml | None:
        """The GPU at ``pci_bus_id`` (else NVML's device 0); None when NVML is absent or refuses."""
        try:
            library = ctypes.CDLL("libnvidia-ml.so.1")
        except OSError:
            return None
        handle = ctypes.c_void_p()
        try:
            if library.nvmlInit_v2() != NVML_SUCCESS:
                return None
            if pci_bus_id:
                found = library.nvmlDeviceGetHandleByPciBusId_v2(pci_bus_id.encode(), ctypes.byref(handle))
            else:
                found = library.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(0), ctypes.byref(handle))
        except AttributeError:
            return None
        return cls(library, handle) if found == NVML_SUCCESS else None

    def _query(self, function: str, kind: int) -> float | None:
        value = ctypes.c_uint()
        if getattr(self.library, function)(self.handle, ctypes.c_int(kind), ctypes.byref(value)) != NVML_SUCCESS:
            return None
        return float(value.value)

    def sm_clock(self) -> float | None:
        return self._query("nvmlDeviceGetClockInfo", NVML_CLOCK_SM)

    def max_sm_clock(self) -> float | None:
        return self._query("nvmlDeviceGetMaxClockInfo", NVML_CLOCK_SM)

    def temperature(self) -> float | None:
        return self._query("nvmlDeviceGetTemperature", NVML_TEMPERATURE_GPU)


def persisting_reset(runtime, driver: str = "libcuda.so.1") -> tuple[Callable[[], None] | None, str]:
    """How cold samples reset the persisting L2 lines, and the words the section records for it."""
    reset = getattr(runtime, "ctxResetPersistingL2Cache", None)
    if reset is not None:
        return reset, "reset before every cold sample: cupy.cuda.runtime.ctxResetPersistingL2Cache"
    try:
        function = ctypes.CDLL(driver).cuCtxResetPersistingL2Cache
    except (OSError, AttributeError):
        return None, (f"not reset: CuPy's runtime module has no ctxResetPersistingL2Cache and {driver} no "
                      "cuCtxResetPersistingL2Cache")

    def driver_reset() -> None:
        status = function()
        if status != CUDA_SUCCESS:
            raise DeviceUnavailable(f"cuCtxResetPersistingL2Cache failed (CUresult {status})")

    status = function()  # once now: a context it cannot reset is said, not a failure of every sample
    if status != CUDA_SUCCESS:
        return None, f"not reset: cuCtxResetPersistingL2Cache of {driver} returned CUresult {status}"
    return driver_reset, (f"reset before every cold sample: cuCtxResetPersistingL2Cache of {driver} (the driver "
                          "API through ctypes: CuPy's runtime module has no ctxResetPersistingL2Cache)")


def _best(run: Callable[[], float], repeats: int = PEAK_REPEATS) -> float:
    return min(run() for _ in range(repeats))


class HostTimer:
    """perf_counter around the emulated launches (synchronous on the CPU)."""

    name = "host-perf-counter"
    caveat = HOST_CAVEAT
    fallback = None
    max_clock_mhz = None
    resolution_s = 1e-7
    cache_bytes = HOST_FLUSH_BYTES // 2
    persisting_l2 = None  # the host has no persisting L2

    def __init__(self, backend):
        self.backend = backend
        self._flush = np.zeros(HOST_FLUSH_BYTES, np.uint8)

    def issue(self, launches: Sequence[RecordedLaunch]) -> Callable[[], None]:
        def run() -> None:
            for launch in launches:
                self.backend.launch(launch.entry, launch.function, launch.grid, launch.block, launch.args)
        return run

    graph = issue  # the host has no graphs: a step is its launches in order

    def sample(self, issue: Callable[[], None], guard: Guard, cold: bool) -> Reading:
        guard.poison()
        if cold:
            np.add(self._flush, 1, out=self._flush)
        started = time.perf_counter()
        issue()
        return Reading(time.perf_counter() - started)

    def measured_peaks(self) -> dict:
        """The host's copy bandwidth and binary32 multiply-add rate, measured with NumPy."""
        source = np.ones(COPY_BYTES // 8, np.float32)
        target = np.empty_like(source)

        def copy() -> float:
            started = time.perf_counter()
            np.copyto(target, source)
            return time.perf_counter() - started

        x, y = np.ones(1 << 22, np.float32), np.full(1 << 22, 1.0001, np.float32)
        z = np.empty_like(x)

        def multiply_add() -> float:
            started = time.perf_counter()
            np.multiply(x, y, out=z)
            np.add(z, x, out=z)
            return time.perf_counter() - started

        return {"bandwidth_bytes_per_s": 2 * source.nbytes / _best(copy),
                "ops_per_s": 2 * x.size / _best(multiply_add), "how": "NumPy copy and multiply-add on the host"}

    def close(self) -> None:
        """Nothing to release."""


class CudaTimer:
    """CUDA events behind a blocking kernel, L2 flushed for cold samples, NVML clocks."""

    name = "cuda-events"
    caveat = None
    fallback = None  # why CUPTI was not used, where it was wanted (timer_for)
    resolution_s = 0.5e-6  # cudaEventElapsedTime's, as the CUDA documentation gives it

    def __init__(self, backend):
        self.backend = backend
        cp = self.cp = backend.cp
        try:
            device = cp.cuda.Device()
            attributes = device.attributes
            self.sms = int(attributes["MultiProcessorCount"])
            self.stream = cp.cuda.Stream(non_blocking=True)
            self.start, self.end = cp.cuda.Event(), cp.cuda.Event()
            self._release = cp.cuda.pinned_memory.PinnedMemory(8, HOST_ALLOC_MAPPED)
            self.flag = ctypes.c_int.from_address(self._release.ptr)
            self.cache_bytes = int(attributes["L2CacheSize"])
            self._flush = cp.empty(max(2 * self.cache_bytes, MIN_FLUSH_BYTES), dtype=cp.uint8)
            bus = getattr(device, "pci_bus_id", None)
        except Exception as error:
            raise DeviceUnavailable(f"the bench cannot set up its CUDA timer: {error}") from None
        self._reset_persisting, self.persisting_l2 = persisting_reset(cp.cuda.runtime)
        self._flushes = 0
        self.hold = self._utility(HOLD_ENTRY)
        self.nvml = Nvml.open(bus)
        self.max_clock_mhz = self.nvml.max_sm_clock() if self.nvml is not None else None

    def _utility(self, entry: str):
        module = ModuleSource(entry, entry, Path("csa_bench_utilities.cu"), UTILITIES, UTILITY_BUILD)
        function = self.backend.function(module)
        self.backend.builds.pop(entry, None)  # a utility is no module of the kernel directory
        return function

    def issue(self, launches: Sequence[RecordedLaunch]) -> Callable[[], None]:
        def run() -> None:
            for launch in launches:
                launch.function(launch.grid, launch.block, launch.args, stream=self.stream)
        return run

    def graph(self, launches: Sequence[RecordedLaunch]) -> Callable[[], None]:
        """The launches captured once into a CUDA graph; the result launches it on the timer's stream."""
        try:
            self.stream.begin_capture()
            try:
                self.issue(launches)()
            finally:
                graph = self.stream.end_capture()
        except Exception as error:
            raise DeviceUnavailable(f"CUDA graph capture of the step failed: {error}") from None
        return lambda: graph.launch(self.stream)

    def sample(self, issue: Callable[[], None], guard: Guard, cold: bool) -> Reading:
        cp = self.cp
        try:
            guard.poison()
            if cold:
                if self._reset_persisting is not None:
                    self._reset_persisting()
                self._flushes += 1
                self._flush.fill(self._flushes & 0xFF)
            cp.cuda.runtime.deviceSynchronize()
            seconds = self._held(issue)
        except DeviceUnavailable:
            self.flag.value = 1
            raise
        except Exception as error:
            self.flag.value = 1
            raise DeviceUnavailable(f"a timed launch failed: {error}") from None
        if self.nvml is None:
            return Reading(seconds)
        return Reading(seconds, self.nvml.sm_clock(), self.nvml.temperature())

    def _hold(self) -> None:
        """The stream held until the flag is set: nothing queued behind it starts before the flag."""
        self.flag.value = 0
        self.hold((1, 1, 1), (1, 1, 1), (np.uint64(self._release.ptr), np.uint64(HOLD_TIMEOUT_NS)),
                  stream=self.stream)

    def _held(self, issue: Callable[[], None]) -> float:
        """One repetition behind the hold kernel, timed by the events around it."""
        self._hold()
        self.start.record(self.stream)
        issue()
        self.end.record(self.stream)
        self.flag.value = 1
        self.end.synchronize()
        return self.cp.cuda.get_elapsed_time(self.start, self.end) / 1e3

    def _timed(self, launch: Callable[[], None]) -> float:
        self.start.record(self.stream)
        launch()
        self.end.record(self.stream)
        self.end.synchronize()
        return self.cp.cuda.get_elapsed_time(self.start, self.end) / 1e3

    def measured_peaks(self) -> dict:
        """HBM bandwidth of a float4 copy of 256 MiB and the FMA rate of 8 independent chains per thread."""
        cp = self.cp
        copy, fma = self._utility("csa_bench_copy"), self._utility("csa_bench_fma")
        source = cp.zeros(COPY_BYTES // 4, dtype=cp.float32)
        target = cp.empty_like(source)
        count = np.int64(source.size // 4)
        grid, block = (self.sms * 8, 1, 1), (256, 1, 1)
        out = cp.empty(grid[0] * block[0], dtype=cp.float32)
        try:
            copy_s = _best(lambda: self._timed(lambda: copy(grid, block, (source, target, count), stream=self.stream)))
            fma_s = _best(lambda: self._timed(lambda: fma(
                grid, block, (out, np.int32(FMA_ITERATIONS), np.float32(0.999), np.float32(0.001)),
                stream=self.stream)))
        except Exception as error:
            raise DeviceUnavailable(f"the bench's peak kernels failed: {error}") from None
        operations = grid[0] * block[0] * FMA_ITERATIONS * FMA_CHAINS * 2
        return {"bandwidth_bytes_per_s": 2 * COPY_BYTES / copy_s, "ops_per_s": operations / fma_s,
                "how": "a float4 copy of 256 MiB and 8 independent fmaf chains per thread (an FMA counts 2)"}

    def close(self) -> None:
        self.flag.value = 1


class CuptiTimer(CudaTimer):
    """As CudaTimer (hold kernel, L2 flush, NVML), but a repetition's time is CUPTI's: from the first start to
    the last end of its kernels on the GPU (csa_conform.bench.cupti), the hold, flush and poison left out."""

    name = "cupti"
    resolution_s = 32e-9  # the GPU clock behind CUPTI's ns timestamps ticks at 31.25 MHz while a tool traces

    def __init__(self, backend, activity: Activity):
        super().__init__(backend)
        self.activity = activity
        self._launches = 0

    def issue(self, launches: Sequence[RecordedLaunch]) -> Callable[[], None]:
        run = super().issue(launches)
        return self._counted(run, len(launches))

    def graph(self, launches: Sequence[RecordedLaunch]) -> Callable[[], None]:
        return self._counted(super().graph(launches), len(launches))  # one kernel node per launch

    def _counted(self, run: Callable[[], None], launches: int) -> Callable[[], None]:
        def counted() -> None:
            self._launches = launches
            run()
        return counted

    def _held(self, issue: Callable[[], None]) -> float:
        self.activity.drain()  # what ran before (earlier rows, this sample's poison and flush) goes first
        self._hold()
        issue()
        self.flag.value = 1
        self.stream.synchronize()
        records = self.activity.drain()
        holds = sum(record.name == HOLD_ENTRY for record in records)
        if holds != 1 or len(repetition_records(records, HOLD_ENTRY)) < self._launches:
            records += self.activity.drain(forced=True)  # a buffer CUPTI had not yet called complete
        return repetition_seconds(records, HOLD_ENTRY, self._launches)


AUTO, CUPTI, EVENTS = "auto", "cupti", "events"
TIMERS = (AUTO, CUPTI, EVENTS)


TIMER_CHOICE = {CuptiTimer.name: CUPTI, CudaTimer.name: EVENTS}


def baseline_timer(choice: str, recorded: str | None, origin: str) -> str:
    """The timer that samples a run gated against a recorded baseline: the baseline's own under ``auto``, so
    the gate never compares CUPTI with events; an explicit other choice is a UsageError."""
    wanted = TIMER_CHOICE.get(recorded)
    if wanted is None or choice == wanted:
        return choice
    if choice == AUTO:
        return wanted
    raise UsageError(f"{origin} was timed with {recorded}: --timer {choice} would gate one timer against another "
                     f"(give --timer {wanted} or auto)")


def cupti_activity(choice: str, candidates: Sequence[str] | None = None) -> tuple[Activity | None, str | None]:
    """CUPTI's activity for ``choice`` (``events``: not tried), or None and why not; ``cupti`` without it is
    DeviceUnavailable."""
    if choice == EVENTS:
        return None, None
    activity, reason = open_activity(candidates)
    if activity is None and choice == CUPTI:
        raise DeviceUnavailable(f"--timer cupti: {reason}")
    return activity, reason


def timer_for(backend, choice: str = AUTO):
    """The timer of a backend: for the CUDA backend CUPTI where ``choice`` and the machine allow (else CUDA
    events, the reason kept as ``fallback``), perf_counter for the host emulation."""
    if not hasattr(backend, "cp"):
        return HostTimer(backend)
    activity, reason = cupti_activity(choice)
    if activity is not None:
        return CuptiTimer(backend, activity)
    timer = CudaTimer(backend)
    if reason is not None:
        timer.fallback = f"{reason}; timed with CUDA events instead"
    return timer
