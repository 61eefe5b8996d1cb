"""Launches as they ran, with the buffers allocated for them: one record for both uses of it.

A graph replay (csa_conform.device.replay) captures a step's launches again
and needs which arguments the step allocated (they are the graph's own, not
inputs to copy in) and the ABI's pre-fill of each; the bench
(csa_conform.bench.recording) times the launches again and needs, per
launch, the buffers allocated for it since the launch before (its outputs and
scratch, poisoned before a timed run and checked after it).
"""

from __future__ import annotations

from dataclasses import dataclass

from csa_conform.device.kernels import MODULES
from csa_conform.spec import LAUNCHES

MODULE_OF = {entry: module for module, entry in MODULES.items()}

# entry -> the stages its launch computes, for naming what a replay mismatch or a timed row covers
LAUNCH_STAGES = {MODULES[launch.module]: launch.stages for launch in LAUNCHES}


@dataclass(frozen=True)
class Owned:
    """A buffer a launch writes: its argument position and the ABI's pre-fill (None: left uninitialised)."""

    position: int
    buffer: object
    fill: object = None


@dataclass(frozen=True)
class Allocation:
    """A buffer allocated during the step and the ABI's pre-fill (None: left uninitialised)."""

    buffer: object
    fill: object = None


@dataclass
class RecordedLaunch:
    """One eager launch: what a graph captures and a timer issues again."""

    entry: str
    function: object
    grid: tuple
    block: tuple
    args: tuple
    owned: tuple[Owned, ...]  # the buffers allocated since the launch before
    written: frozenset[int]  # positions of the buffers allocated for this step (outputs and scratch)

    @property
    def module(self) -> str:
        return MODULE_OF.get(self.entry, self.entry)

    @property
    def stages(self) -> tuple[str, ...]:
        return LAUNCH_STAGES.get(self.entry, ())


class LaunchRecorder:
    """A backend that records the launches of the current step and the buffers it allocates."""

    def __init__(self, backend):
        self.inner = backend
        self.launches: list[RecordedLaunch] = []
        self._step: dict[int, Allocation] = {}  # id(buffer) -> allocated since the last take_step
        self._pending: dict[int, Allocation] = {}  # id(buffer) -> allocated since the last launch

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def empty(self, shape, dtype):
        return self._allocated(self.inner.empty(shape, dtype), None)

    def full(self, shape, value, dtype):
        return self._allocated(self.inner.full(shape, value, dtype), value)

    def _allocated(self, buffer, fill):
        self._step[id(buffer)] = self._pending[id(buffer)] = Allocation(buffer, fill)
        return buffer

    def launch(self, entry, function, grid, block, args) -> None:
        self.inner.launch(entry, function, grid, block, args)
        owned = tuple(Owned(position, arg, self._pending[id(arg)].fill)
                      for position, arg in enumerate(args) if id(arg) in self._pending)
        written = frozenset(position for position, arg in enumerate(args) if id(arg) in self._step)
        self._pending = {}
        self.launches.append(RecordedLaunch(entry, function, tuple(grid), tuple(block), tuple(args), owned, written))

    def take_step(self) -> tuple[list[RecordedLaunch], dict[int, Allocation]]:
        """The launches recorded and the buffers allocated since the last call."""
        step, allocated = self.launches, self._step
        self.launches, self._step = [], {}
        return step, allocated
