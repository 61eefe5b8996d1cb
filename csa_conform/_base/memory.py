"""The memory a run may still use, and one error when a need is larger.

CI containers cap memory three ways: an address-space limit (``ulimit -v``,
RLIMIT_AS), a cgroup limit (memory.max) and the machine itself. ``headroom``
is the smallest of what each still allows. Arrays read from a file are
allocated through ``allocate`` before any byte is read, so a dataset that
needs more than the limit is reported as the limit it hits (exit 4), never
as a damaged file; ``require`` refuses a known need before work starts.
"""

from __future__ import annotations

import math
import resource
from pathlib import Path

import numpy as np

from csa_conform.errors import MemoryShortage

__all__ = ["address_space_left", "allocate", "headroom", "human", "require", "shared_headroom", "small_pages"]

_CGROUP = Path("/sys/fs/cgroup")


def human(nbytes: int) -> str:
    if nbytes < 1 << 20:
        return f"{nbytes} bytes"
    if nbytes < 1 << 30:
        return f"{nbytes / (1 << 20):.1f} MiB"
    return f"{nbytes / (1 << 30):.2f} GiB"


def _status_bytes(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def address_space_left() -> tuple[int, str] | None:
    """(bytes of address space left under RLIMIT_AS, the limit in words), or None without a limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    used = _status_bytes("VmSize") or 0
    return max(0, soft - used), f"address-space limit (ulimit -v) of {human(soft)}"


def _cgroup_left() -> tuple[int, str] | None:
    try:
        limit = (_CGROUP / "memory.max").read_text().strip()
        if limit == "max":
            return None
        current = int((_CGROUP / "memory.current").read_text().strip())
        return max(0, int(limit) - current), f"cgroup memory limit of {human(int(limit))}"
    except (OSError, ValueError):
        return None


def _machine_left() -> tuple[int, str] | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, "memory available on this machine"
    except (OSError, ValueError, IndexError):
        return None
    return None


def headroom() -> tuple[int, str] | None:
    """(bytes this process may still allocate, what bounds it), or None when nothing can be read."""
    bounds = [bound for bound in (address_space_left(), _cgroup_left(), _machine_left()) if bound is not None]
    return min(bounds, key=lambda bound: bound[0]) if bounds else None


def shared_headroom() -> tuple[int, str] | None:
    """What all processes of a run share: the cgroup's and the machine's memory (RLIMIT_AS is per process)."""
    bounds = [bound for bound in (_cgroup_left(), _machine_left()) if bound is not None]
    return min(bounds, key=lambda bound: bound[0]) if bounds else None


def require(nbytes: int, what: str) -> None:
    """Refuse ``what`` up front when it needs more than the headroom."""
    bound = headroom()
    if bound is not None and nbytes > bound[0]:
        raise MemoryShortage(f"{what} needs {human(nbytes)}, more than the {bound[1]} leaves ({human(bound[0])})")


def allocate(shape: tuple[int, ...], dtype: np.dtype, what: str) -> np.ndarray:
    """An uninitialised array of ``shape``; a failed allocation is a MemoryShortage naming the need."""
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    try:
        return np.empty(shape, dtype=dtype)
    except (MemoryError, ValueError):
        bound = headroom()
        limit = f"the {bound[1]}" if bound is not None else "the memory limit"
        raise MemoryShortage(f"{what} needs {human(nbytes)}, more than {limit} allows") from None


def small_pages() -> None:
    """Large arrays in ordinary pages from here on (in this process and the workers it forks).

    NumPy asks for transparent huge pages for every array of 4 MiB or more. Where the kernel
    compacts memory to find them (THP defrag "madvise", as on the CI machines), each fresh array
    costs far more system time than zeroing its pages, and erratically: verify of the prod
    suite spent 1.4-3.7 s of system time with them, 1.4-1.6 s without. generate and verify pass
    over each of their arrays a few times, too few to gain from fewer TLB misses.
    """
    multiarray = getattr(np, "_core", None) or np.core
    toggle = getattr(getattr(multiarray, "multiarray", None), "_set_madvise_hugepage", None)
    if toggle is not None:
        toggle(False)
