"""CUPTI's kernel activity records, read through ctypes: the GPU's own start and end of every kernel.

``open_activity`` loads libcupti, registers the buffer callbacks and enables
CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL once per process (CUPTI has one
set of callbacks per process, so every CUPTI timer shares the one
``Activity``); where it cannot, it says why (cuptiGetResultString's words),
so the bench falls back to CUDA events and records the reason. Records are
read as ``KernelRecord`` (the fields of CUDA 13.0's CUpti_ActivityKernel10
up to ``name``: ``ActivityKernel10``'s layout, checked against the header by
tests/bench/test_cupti.py), so only a libcupti of CUDA 13's API versions is
read. ``repetition_seconds`` is the pure rule that turns one repetition's
records into its time.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from csa_conform.errors import DeviceUnavailable

CUPTI_SUCCESS = 0
KIND_CONCURRENT_KERNEL = 10  # CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL
FLUSH_FORCED = 1  # CUPTI_ACTIVITY_FLAG_FLUSH_FORCED
BUFFER_BYTES = 4 << 20
RECORD_ALIGNMENT = 8  # ACTIVITY_RECORD_ALIGNMENT of cupti_common.h
LIBRARY_NAMES = ("libcupti.so", "libcupti.so.13")
LAYOUT_VERSIONS = range(130000, 140000)  # CUPTI_API_VERSION of CUDA 13.x: the kernel record is CUpti_ActivityKernel10
LIBRARY_DIRS = ("lib64", "targets/x86_64-linux/lib", "extras/CUPTI/lib64")


class ActivityKernel10(ctypes.Structure):
    """CUpti_ActivityKernel10 (cupti_activity.h of CUDA 13.0, packed, 8-byte aligned) up to ``name``."""

    _pack_ = 1
    _fields_ = [
        ("kind", ctypes.c_uint32),
        ("cacheConfig", ctypes.c_uint8),
        ("sharedMemoryConfig", ctypes.c_uint8),
        ("registersPerThread", ctypes.c_uint16),
        ("partitionedGlobalCacheRequested", ctypes.c_uint32),
        ("partitionedGlobalCacheExecuted", ctypes.c_uint32),
        ("start", ctypes.c_uint64),
        ("end", ctypes.c_uint64),
        ("completed", ctypes.c_uint64),
        ("deviceId", ctypes.c_uint32),
        ("contextId", ctypes.c_uint32),
        ("streamId", ctypes.c_uint32),
        ("gridX", ctypes.c_int32),
        ("gridY", ctypes.c_int32),
        ("gridZ", ctypes.c_int32),
        ("blockX", ctypes.c_int32),
        ("blockY", ctypes.c_int32),
        ("blockZ", ctypes.c_int32),
        ("staticSharedMemory", ctypes.c_int32),
        ("dynamicSharedMemory", ctypes.c_int32),
        ("localMemoryPerThread", ctypes.c_uint32),
        ("localMemoryTotal", ctypes.c_uint32),
        ("correlationId", ctypes.c_uint32),
        ("gridId", ctypes.c_int64),
        ("name", ctypes.c_void_p),
    ]


@dataclass(frozen=True)
class KernelRecord:
    """One kernel as CUPTI saw it: GPU timestamps in ns, the stream and the launch (API call) it came from."""

    name: str
    start: int
    end: int
    stream: int
    correlation: int

    @classmethod
    def read(cls, record: ActivityKernel10) -> KernelRecord:
        name = ctypes.string_at(record.name).decode("utf-8", "replace") if record.name else ""
        return cls(name, int(record.start), int(record.end), int(record.streamId), int(record.correlationId))


def repetition_records(records: Sequence[KernelRecord], hold: str) -> list[KernelRecord]:
    """The kernels of one repetition: launched after the (single) hold kernel, on its stream, the hold excluded.

    The stream keeps out the poison, the L2 flush and anything else on other streams; the correlation id
    (CUPTI numbers API calls in issue order; a graph's kernel nodes share their graph launch's) keeps out
    what ran on the stream before the hold."""
    holds = [record for record in records if record.name == hold]
    if len(holds) != 1:
        raise DeviceUnavailable(f"CUPTI delivered {len(holds)} records of the hold kernel {hold} for one repetition "
                                "(expected 1): its kernel records cannot be told apart")
    (anchor,) = holds
    return [record for record in records if record.stream == anchor.stream and record.name != hold
            and record.correlation > anchor.correlation]


def repetition_seconds(records: Sequence[KernelRecord], hold: str, launches: int) -> float:
    """Last end minus first start of the repetition's ``launches`` kernels; nonsense is an error, never a time."""
    mine = repetition_records(records, hold)
    if len(mine) != launches:
        raise DeviceUnavailable(f"CUPTI delivered {len(mine)} kernel records for a repetition of {launches} "
                                "launches")
    bad = next((record for record in mine if record.start == 0 or record.end < record.start), None)
    if bad is not None:
        raise DeviceUnavailable(f"CUPTI's record of {bad.name} has start {bad.start} ns and end {bad.end} ns")
    return (max(record.end for record in mine) - min(record.start for record in mine)) / 1e9


def layout_refusal(version: int) -> str | None:
    """Why a libcupti of this CUPTI_API_VERSION cannot be read (its kernel record may differ), else None."""
    if version in LAYOUT_VERSIONS:
        return None
    return (f"its CUPTI API version is {version}; the kernel records read here are CUDA 13's "
            f"(CUPTI API versions {LAYOUT_VERSIONS.start} to {LAYOUT_VERSIONS.stop - 1})")


def library_candidates() -> list[str]:
    """Where libcupti is looked for: the loader's path, then $CUDA_PATH, $CUDA_HOME, CuPy's CUDA, /usr/local/cuda
    and the versioned /usr/local/cuda-* (newest first): CUDA installs it beside its other libraries, not on the
    loader's path."""
    roots = [os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME")]
    try:
        import cupy

        roots.append(cupy.cuda.get_cuda_path())
    except Exception:  # no CuPy, or CuPy without a CUDA path: the other places still count
        pass
    roots.append("/usr/local/cuda")
    versioned = Path("/usr/local").glob("cuda-*")
    roots += [str(path) for path in sorted(versioned, key=lambda path: [int(n) for n in re.findall(r"\d+", path.name)],
                                           reverse=True)]
    found = list(LIBRARY_NAMES)
    for root in dict.fromkeys(root for root in roots if root):
        found += [str(Path(root) / folder / name) for folder in LIBRARY_DIRS for name in LIBRARY_NAMES]
    return found


BUFFER_REQUESTED = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t),
                                    ctypes.POINTER(ctypes.c_size_t))
BUFFER_COMPLETED = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t,
                                    ctypes.c_size_t)


class Activity:
    """CUPTI's kernel activity of this process: buffers handed to CUPTI, the kernel records it gave back."""

    def __init__(self, library: ctypes.CDLL, path: str):
        self.library = library
        self.path = path
        self._buffers: dict[int, ctypes.Array] = {}  # address -> the buffer CUPTI fills (kept alive here)
        self._records: list[KernelRecord] = []
        self._lock = threading.Lock()
        # CUPTI calls these from its own threads: the ctypes objects must live as long as the registration.
        self._requested = BUFFER_REQUESTED(self._on_requested)
        self._completed = BUFFER_COMPLETED(self._on_completed)
        library.cuptiActivityGetNextRecord.argtypes = [ctypes.c_void_p, ctypes.c_size_t,
                                                       ctypes.POINTER(ctypes.c_void_p)]

    def reason(self, status: int) -> str:
        text = ctypes.c_char_p()
        if self.library.cuptiGetResultString(status, ctypes.byref(text)) != CUPTI_SUCCESS or not text.value:
            return f"CUptiResult {status}"
        return f"{text.value.decode('utf-8', 'replace')} (CUptiResult {status})"

    def _on_requested(self, buffer, size, records) -> None:
        raw = ctypes.create_string_buffer(BUFFER_BYTES + RECORD_ALIGNMENT)
        address = ctypes.addressof(raw)
        aligned = address + (-address % RECORD_ALIGNMENT)
        with self._lock:
            self._buffers[aligned] = raw
        buffer[0] = aligned
        size[0] = BUFFER_BYTES
        records[0] = 0

    def _on_completed(self, context, stream, buffer, size, valid) -> None:
        found = []
        record = ctypes.c_void_p()
        next_record = self.library.cuptiActivityGetNextRecord
        while next_record(buffer, valid, ctypes.byref(record)) == CUPTI_SUCCESS:
            if ctypes.c_uint32.from_address(record.value).value == KIND_CONCURRENT_KERNEL:
                found.append(KernelRecord.read(ActivityKernel10.from_address(record.value)))
        with self._lock:
            self._records += found
            self._buffers.pop(buffer, None)

    def start(self) -> str | None:
        """Register the callbacks and enable kernel records; None, or why CUPTI refused."""
        version = ctypes.c_uint32()
        status = self.library.cuptiGetVersion(ctypes.byref(version))
        if status != CUPTI_SUCCESS:
            return f"cuptiGetVersion of {self.path} failed: {self.reason(status)}"
        refused = layout_refusal(version.value)
        if refused:
            return f"{self.path}: {refused}"
        for call, arguments in (("cuptiActivityRegisterCallbacks", (self._requested, self._completed)),
                                ("cuptiActivityEnable", (KIND_CONCURRENT_KERNEL,))):
            status = getattr(self.library, call)(*arguments)
            if status != CUPTI_SUCCESS:
                return f"{call} of {self.path} failed: {self.reason(status)}"
        return None

    def stop(self) -> None:
        """No more records, every buffer handed back: at exit, while Python can still run the callbacks."""
        self.library.cuptiActivityDisable(KIND_CONCURRENT_KERNEL)
        self.library.cuptiActivityFlushAll(FLUSH_FORCED)

    def drain(self, forced: bool = False) -> list[KernelRecord]:
        """Every kernel record CUPTI completed so far (after a synchronize: everything launched before it)."""
        status = self.library.cuptiActivityFlushAll(FLUSH_FORCED if forced else 0)
        if status != CUPTI_SUCCESS:
            raise DeviceUnavailable(f"cuptiActivityFlushAll failed: {self.reason(status)}")
        with self._lock:
            records, self._records = self._records, []
        return records


_OPENED: tuple[Activity | None, str | None] | None = None


def open_activity(candidates: Sequence[str] | None = None) -> tuple[Activity | None, str | None]:
    """The process's kernel activity (the first loadable library of ``candidates``, default
    ``library_candidates()``), or None and why not. Started once: CUPTI allows one registration per process."""
    global _OPENED
    names = tuple(library_candidates() if candidates is None else candidates)
    library, path, first_error = None, None, None
    for name in names:
        try:
            library, path = ctypes.CDLL(name), name
            break
        except OSError as error:
            first_error = first_error or str(error)
    if library is None:
        return None, (f"CUPTI not found: none of {len(names)} places holds a loadable libcupti "
                      f"(first: {first_error or 'no candidates'})")
    if _OPENED is None:
        activity = Activity(library, path)
        refused = activity.start()
        _OPENED = (None, refused) if refused else (activity, None)
        if not refused:
            atexit.register(activity.stop)
    return _OPENED
