"""``diff --repeat N``: every launch run N times on fresh, poisoned buffers, its outputs compared byte for byte.

One run cannot see a race, a reduction whose order depends on scheduling, or
a read of scratch the kernel never wrote (memory that happens to hold zeros,
or the same bytes every time, hides it). Here every buffer a launch writes,
scratch and outputs alike, is allocated anew for each run: those the ABI
leaves uninitialised are filled with a different byte pattern per run (never
zeros; one of them is a NaN in every float width), those it pre-fills (-inf
scores, -1 selections) get their fill. The first run's buffers are the ones
the step goes on with, so a deterministic launch changes nothing downstream.
Any byte that differs between runs is a finding of its own kind,
``non-deterministic``, distinct from a divergence from the oracle. On the
host backend, whose threads take turns in a fixed order, the even runs go
the other way round (blocks and threads from the last down), so a missing
barrier that only a later thread running first exposes differs between runs;
on CUDA the later runs stagger the warps' departures from every barrier, the
last warp first in the even runs and the first warp first in the odd ones
(csa_conform.device.schedule).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, ClassVar, Sequence

import numpy as np

from csa_conform._base.statuses import NONDETERMINISTIC
from csa_conform.device.schedule import turn
from csa_conform.numerics.bits import unsigned

# One byte pattern per run, cycled; 0xA5 first, the pattern a plain run's scratch holds (spec.POISON).
POISON = (0xA5, 0xFF, 0x5A, 0xC3, 0x3C, 0x96, 0x69, 0xE1)


@dataclass
class _Fresh:
    """A buffer allocated for the launch about to run, and how to make it again."""

    buffer: object
    shape: tuple
    dtype: np.dtype
    fill: object = None  # None: uninitialised (poisoned); else the ABI's pre-fill value


class PoisonedScratch:
    """A backend whose uninitialised buffers hold a chosen byte, remembering what each launch allocated."""

    def __init__(self, backend):
        self.inner = backend
        self.pattern = POISON[0]
        self._fresh: list[_Fresh] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def empty(self, shape, dtype):
        buffer = poisoned(self.inner, shape, dtype, self.pattern)
        self._fresh.append(_Fresh(buffer, tuple(shape), np.dtype(dtype)))
        return buffer

    def full(self, shape, value, dtype):
        buffer = self.inner.full(shape, value, dtype)
        self._fresh.append(_Fresh(buffer, tuple(shape) if isinstance(shape, tuple) else (shape,), np.dtype(dtype),
                                  value))
        return buffer

    def take_fresh(self) -> list[_Fresh]:
        fresh, self._fresh = self._fresh, []
        return fresh

    def remake(self, fresh: _Fresh, pattern: int):
        if fresh.fill is None:
            return poisoned(self.inner, fresh.shape, fresh.dtype, pattern)
        return self.inner.full(fresh.shape, fresh.fill, fresh.dtype)


def poisoned(backend, shape, dtype, pattern: int):
    """A buffer of ``shape`` whose every byte is ``pattern`` (the backend's own poison when it has one)."""
    if hasattr(backend, "poisoned"):
        return backend.poisoned(shape, dtype, pattern)
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    return backend.upload(np.full(count * dtype.itemsize, pattern, np.uint8).view(dtype).reshape(shape))


@dataclass(frozen=True)
class Nondeterminism:
    """One buffer of one launch whose bytes differ between runs."""

    kind: ClassVar[str] = NONDETERMINISTIC
    entry: str
    module: str
    stages: tuple[str, ...]
    argument: int
    name: str
    runs: int
    differing_runs: int
    first_run: int
    element: int
    coords: tuple[int, ...]
    first_bits: str
    other_bits: str

    @property
    def message(self) -> str:
        name = f" ({self.name})" if self.name else ""
        return (f"non-deterministic: {self.differing_runs} of {self.runs} runs differ from run 1 in argument "
                f"{self.argument}{name} of {self.entry}; first at run {self.first_run}, element {self.element} "
                f"{list(self.coords)}: run 1 {self.first_bits}, run {self.first_run} {self.other_bits}")

    def to_dict(self) -> dict:
        record = asdict(self)
        record["stages"] = list(self.stages)
        record["coords"] = list(self.coords)
        return record


def _bits(array: np.ndarray) -> np.ndarray:
    return unsigned(array).reshape(-1)


def repeat_launch(backend: PoisonedScratch, launch: Callable[[tuple], None], args: tuple, runs: int, *,
                  entry: str, module: str, stages: tuple[str, ...], parameters: Sequence[str]) -> list[Nondeterminism]:
    """Run ``launch(args)`` then ``runs - 1`` more times on remade buffers, each later run in the backend's
    other thread order for it (``schedule``, where the backend has one); what differs, per buffer."""
    fresh = [item for item in backend.take_fresh() if any(arg is item.buffer for arg in args)]
    launch(args)
    first = [_bits(backend.download(item.buffer)) for item in fresh]
    differing: dict[int, list[tuple[int, int, int]]] = {}
    schedule = getattr(backend, "schedule", None)
    for run in range(1, runs):
        remade = {id(item.buffer): backend.remake(item, POISON[run % len(POISON)]) for item in fresh}
        if schedule is not None:
            schedule(turn(run))
        try:
            launch(tuple(remade.get(id(arg), arg) for arg in args))
        finally:
            if schedule is not None:
                schedule(0)
        for index, item in enumerate(fresh):
            bits = _bits(backend.download(remade[id(item.buffer)]))
            where = np.flatnonzero(bits != first[index])
            if where.size:
                differing.setdefault(index, []).append((run + 1, int(where[0]), int(bits[where[0]])))
    findings = []
    for index, found in sorted(differing.items()):
        item = fresh[index]
        argument = next(position for position, arg in enumerate(args) if arg is item.buffer)
        run, element, other = min(found, key=lambda entry: (entry[1], entry[0]))
        width = 2 * item.dtype.itemsize
        findings.append(Nondeterminism(
            entry, module, stages, argument, parameters[argument] if argument < len(parameters) else "",
            runs, len(found), run, element,
            tuple(int(i) for i in np.unravel_index(element, item.shape)) if item.shape else (),
            f"0x{int(first[index][element]):0{width}x}", f"0x{other:0{width}x}",
        ))
    return findings
