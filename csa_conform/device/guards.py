"""Guard bands: poisoned bytes before and after every buffer a launch may write, checked after each launch.

A write past the end of a buffer (an off-by-one loop bound, one thread too
many) that lands in memory nothing reads back leaves every payload
bit-exact, and on a GPU the same write lands in whichever allocation follows
or faults the context later. Both backends therefore allocate each output
and scratch buffer with bands of their own allocation on either side
(csa_conform.device.cuda, csa_conform.device.host), each buffer of a step
with a band byte of its own (``BAND_BYTES``, in the order the step allocates
them), so that a kernel copying one buffer's band into another's (a read and
a write one past two ends) still changes a band; after each
launch the bands of every buffer this step allocated and the launch took
are read back, and a changed byte is the kernel's defect: an
``out-of-bounds`` finding naming the launch, the argument, the side and how
far the write reached. The band is then restored, so a later launch is
blamed only for its own writes. Under compute-sanitizer's memcheck the CUDA
backend allocates no bands (memcheck must see the write itself), and the
check has nothing to read.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar, Sequence

import numpy as np

from csa_conform._base.statuses import OUT_OF_BOUNDS

# The bands' bytes, 0xD0..0xDF from 0xDB on: none of --repeat's poison patterns (csa_conform.device.determinism),
# nor 0x00 or 0xFF, so a kernel copying zeros, -1, NaN or uninitialised scratch past an end still changes a band;
# repeated, each is a number no kernel computes by chance in binary32 or bf16 (-2.8e10 to -3.2e19) and a negative
# index. A step allocates fewer buffers than there are bytes, so no two of its buffers share one.
BAND_BYTES = tuple(0xD0 + (0xB + k) % 16 for k in range(16))
GUARD_BYTE = BAND_BYTES[0]  # what a backend fills a new buffer's bands with
AFTER = "after"
BEFORE = "before"


@dataclass(frozen=True)
class OutOfBounds:
    """One guard band of one buffer that a launch changed.

    ``first`` is the offset of the changed byte nearest the buffer, ``reach`` the farthest from it, both
    counted from the buffer's start in bytes (past the end: ``first`` >= ``size``; before the start: negative).
    """

    kind: ClassVar[str] = OUT_OF_BOUNDS
    entry: str
    module: str
    stages: tuple[str, ...]
    argument: int
    name: str
    side: str
    size: int
    changed: int
    first: int
    reach: int

    @property
    def distance(self) -> int:
        """How many bytes past the end (or before the start) the write reached."""
        return self.reach - self.size + 1 if self.side == AFTER else -self.reach

    @property
    def message(self) -> str:
        name = f" ({self.name})" if self.name else ""
        where = "past the end" if self.side == AFTER else "before the start"
        return (f"out-of-bounds write: {self.module}.cu:{self.entry} wrote {where} of argument {self.argument}{name}, "
                f"a {self.size}-byte buffer: {self.changed} guard byte{'s' if self.changed != 1 else ''} changed, "
                f"reaching {self.distance} byte{'s' if self.distance != 1 else ''} {where.split()[0]} it, "
                f"the first at byte offset {self.first}")

    def to_dict(self) -> dict:
        record = asdict(self)
        record["stages"] = list(self.stages)
        record["distance"] = self.distance
        return record


class GuardedWrites:
    """A step's view of the backend that keeps every buffer the step allocates for its launches (outputs,
    carries, caches, scratch), so that ``check`` reads the bands of those a launch took, and only those:
    an uploaded input carries no band on CUDA. It lives as long as the step, and so do its buffers."""

    def __init__(self, backend):
        self.inner = backend
        self._allocated: dict[int, tuple[object, int]] = {}

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def empty(self, shape, dtype):
        return self._keep(self.inner.empty(shape, dtype))

    def full(self, shape, value, dtype):
        return self._keep(self.inner.full(shape, value, dtype))

    def remake(self, fresh, pattern: int):
        """A later ``--repeat`` run's copy of a buffer (csa_conform.device.determinism), its bands holding the
        first run's byte: a kernel that reads a band reads the same bytes in every run."""
        buffer = self.inner.remake(fresh, pattern)
        self._band(buffer, self._allocated.get(id(fresh.buffer), (None, GUARD_BYTE))[1])
        return buffer

    def _keep(self, buffer):
        byte = BAND_BYTES[len(self._allocated) % len(BAND_BYTES)]
        self._band(buffer, byte)
        self._allocated[id(buffer)] = (buffer, byte)
        return buffer

    def _band(self, buffer, byte: int) -> None:
        if byte != GUARD_BYTE and getattr(self.inner, "guard_bands", None) is not None:
            self.inner.restore_guard_bands(buffer, byte)

    def check(self, args: tuple, *, entry: str, module: str, stages: tuple[str, ...],
              parameters: Sequence[str]) -> list[OutOfBounds]:
        """The bands a launch changed, one finding per buffer and side, each band restored afterwards."""
        bands = getattr(self.inner, "guard_bands", None)
        if bands is None:
            return []
        findings = []
        for argument, arg in enumerate(args):
            buffer, byte = self._allocated.get(id(arg), (None, GUARD_BYTE))
            if buffer is not arg:
                continue
            guard = bands(arg)
            if guard is None:
                continue
            before, after, size = guard
            for side, band in ((BEFORE, before), (AFTER, after)):
                changed = np.flatnonzero(band != byte)
                if not changed.size:
                    continue
                offsets = changed - band.size if side == BEFORE else changed + size
                first, reach = (int(offsets[-1]), int(offsets[0])) if side == BEFORE else (
                    int(offsets[0]), int(offsets[-1]))
                findings.append(OutOfBounds(entry, module, stages, argument,
                                            parameters[argument] if argument < len(parameters) else "",
                                            side, size, int(changed.size), first, reach))
            if any(finding.argument == argument for finding in findings):
                self.inner.restore_guard_bands(arg, byte)
        return findings
