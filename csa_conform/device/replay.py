"""``diff --replay graph``: each stream's launches captured into CUDA graphs and replayed.

Production decodes replay a captured CUDA graph: the kernels, grids, device
buffers and every by-value argument are frozen at capture, and each step only
rewrites the inputs in place. A kernel that reads a length by value, or a
buffer the graph does not own, is right eagerly and wrong under replay. Here
every step still runs eagerly (its payloads are compared with the oracle as
always), with its record caches and scratch reserved at the stream's
capacity, so the extents it passes do not move from step to step. Then the
step's launch sequence is replayed on a graph: the stream keeps one graph per
launch shape (kernels, grids, buffer extents), captured from the first step
of that shape with every module loaded and every buffer allocated, the graph
owning copies of them. Before each replay the step's inputs are copied into
the graph's buffers in place and the buffers the ABI pre-fills are filled
again; afterwards every buffer a launch writes is compared byte for byte with
what the eager run wrote. A difference is a ``replay-mismatch`` naming the
launch and buffer, explained by the by-value arguments that differ between
the capture step and this one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Callable, ClassVar, Mapping

import numpy as np

from csa_conform._base.statuses import REPLAY_MISMATCH
from csa_conform.device.recorder import Allocation, LaunchRecorder, RecordedLaunch
from csa_conform.numerics.bits import unsigned

GRAPH = "graph"
REPLAY_MODES = (GRAPH,)  # what --replay takes


def _is_buffer(arg) -> bool:
    return not (np.isscalar(arg) or isinstance(arg, np.generic))


def _shape(arg) -> tuple:
    return (tuple(int(extent) for extent in arg.shape), str(arg.dtype)) if _is_buffer(arg) else ("value",)


def launch_shape(step: list[RecordedLaunch]) -> tuple:
    """What a graph freezes besides by-value arguments: the kernels, grids, blocks and buffer extents."""
    return tuple((launch.entry, launch.grid, launch.block, tuple(map(_shape, launch.args))) for launch in step)


def fits(graph: list[RecordedLaunch], step: list[RecordedLaunch]) -> bool:
    """Whether a graph captured from ``graph`` can serve ``step``."""
    return launch_shape(graph) == launch_shape(step)


@dataclass(frozen=True)
class ReplayMismatch:
    """A buffer a replayed launch wrote other bytes into than the eager run of the same step."""

    kind: ClassVar[str] = REPLAY_MISMATCH
    entry: str
    stages: tuple[str, ...]
    argument: int
    name: str
    element: int
    eager_bits: str
    replay_bits: str
    captured_step: int
    frozen: tuple[dict, ...] = field(default=())

    @property
    def message(self) -> str:
        name = f" ({self.name})" if self.name else ""
        text = (f"replay differs from eager in argument {self.argument}{name} of {self.entry}, first at element "
                f"{self.element}: eager {self.eager_bits}, replay {self.replay_bits}")
        if not self.frozen:
            return text + f"; no by-value argument changed since the capture at step {self.captured_step}"
        explained = "; ".join(
            f"argument {value['argument']} of {value['entry']}"
            + (f" ({value['name']})" if value["name"] else "")
            + f" is passed by value and was frozen at capture (step {self.captured_step}: {value['captured']}, "
            f"this step: {value['current']})"
            for value in self.frozen
        )
        return f"{text}; {explained}"

    def to_dict(self) -> dict:
        record = asdict(self)
        record["stages"] = list(self.stages)
        record["frozen"] = list(self.frozen)
        return record


def _same_bands(backend, copy, original) -> None:
    """The copy's guard bands hold the original's byte (each buffer of a step has its own,
    csa_conform.device.guards): a kernel that reads past an end reads in the replay what it read eagerly."""
    bands = getattr(backend, "guard_bands", None)
    held = bands(original) if bands is not None else None
    if held is not None and held[0].size:
        backend.restore_guard_bands(copy, int(held[0][0]))


class Graph:
    """A captured launch sequence on buffers of its own; ``replay()`` runs it as captured."""

    def __init__(self, backend, step: list[RecordedLaunch], fresh: Mapping[int, Allocation], index: int):
        self.step_index = index
        own: dict[int, object] = {}
        for launch in step:
            for arg in launch.args:
                if _is_buffer(arg) and id(arg) not in own:
                    own[id(arg)] = backend.empty(tuple(arg.shape), arg.dtype)  # guarded like the eager buffers
                    backend.copy_into(own[id(arg)], arg)
                    _same_bands(backend, own[id(arg)], arg)
        self.fills = {id(own[key]): item.fill for key, item in fresh.items() if key in own and item.fill is not None}
        self.launches = [
            replace(launch, args=tuple(own.get(id(arg), arg) if _is_buffer(arg) else arg for arg in launch.args),
                    owned=tuple(replace(owned, buffer=own[id(owned.buffer)]) for owned in launch.owned))
            for launch in step
        ]
        capture = getattr(backend, "capture", None)
        self._run: Callable[[], None] = capture(self.launches) if capture else self._reissue(backend)

    def _reissue(self, backend) -> Callable[[], None]:
        """What a graph does, for a backend without one: the same launches with the captured arguments."""
        def run():
            for launch in self.launches:
                backend.launch(launch.entry, launch.function, launch.grid, launch.block, launch.args)
        return run

    def replay(self) -> None:
        self._run()


class Replayer:
    """The graphs of the stream being run, one per launch shape, and what replaying each step found."""

    def __init__(self, parameters: Callable[[], Mapping[str, tuple[str, ...]]],
                 stages: Mapping[str, tuple[str, ...]]):
        self._parameters = parameters  # entry -> parameter names, read from the kernel sources when first needed
        self.stages = stages
        self.case: str | None = None
        self.graphs: dict[tuple, Graph] = {}
        self.captures = 0
        self.replayed_steps = 0

    def step(self, backend: LaunchRecorder, case: str, index: int) -> list[ReplayMismatch]:
        launches, fresh = backend.take_step()
        if not launches:
            return []
        if case != self.case:
            self.case, self.graphs = case, {}
        shape = launch_shape(launches)
        graph = self.graphs.get(shape)
        if graph is None:
            self.graphs[shape] = Graph(backend.inner, launches, fresh, index)
            self.captures += 1
            return []
        inner = backend.inner
        for old, new in zip(graph.launches, launches):
            for position, (mine, theirs) in enumerate(zip(old.args, new.args)):
                if not _is_buffer(mine) or position in new.written:
                    continue
                inner.copy_into(mine, theirs)
        for old in graph.launches:
            for position in old.written:
                fill = graph.fills.get(id(old.args[position]))
                if fill is not None:
                    inner.copy_into(old.args[position], inner.full(old.args[position].shape, fill,
                                                                   old.args[position].dtype))
        graph.replay()
        self.replayed_steps += 1
        return self._compare(inner, graph, launches)

    def _compare(self, inner, graph: Graph, launches: list[RecordedLaunch]) -> list[ReplayMismatch]:
        frozen = tuple(
            {"entry": new.entry, "argument": position, "name": self._name(new.entry, position),
             "captured": _plain(old.args[position]), "current": _plain(new.args[position])}
            for old, new in zip(graph.launches, launches)
            for position in range(len(new.args))
            if not _is_buffer(new.args[position]) and _plain(old.args[position]) != _plain(new.args[position])
        )
        found, compared = [], set()
        for old, new in zip(graph.launches, launches):
            for position in sorted(new.written):
                if id(old.args[position]) in compared:
                    continue
                compared.add(id(old.args[position]))
                replayed = _bits(inner.download(old.args[position]))
                eager = _bits(inner.download(new.args[position]))
                differ = np.flatnonzero(replayed != eager)
                if differ.size:
                    element = int(differ[0])
                    width = 2 * eager.dtype.itemsize
                    found.append(ReplayMismatch(
                        new.entry, self.stages.get(new.entry, ()), position, self._name(new.entry, position),
                        element, f"0x{int(eager[element]):0{width}x}", f"0x{int(replayed[element]):0{width}x}",
                        graph.step_index, frozen,
                    ))
        return found

    def _name(self, entry: str, position: int) -> str:
        if callable(self._parameters):
            self._parameters = self._parameters()
        names = self._parameters.get(entry, ())
        return names[position] if position < len(names) else ""

    def describe(self) -> dict:
        return {"mode": GRAPH, "captures": self.captures, "replayed_steps": self.replayed_steps}


def _plain(value):
    value = np.asarray(value)[()]
    return float(value) if isinstance(value, np.floating) else int(value)


def _bits(array: np.ndarray) -> np.ndarray:
    return unsigned(array).reshape(-1)
