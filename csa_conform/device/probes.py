"""Sub-step probes (specs/kernel-abi.md, "Probes"): the log a probed build writes its intermediates into.

A module built with ``-DCSA_PROBES`` copies each ``CSA_PROBE(name, pointer, count)`` into the log the
global ``csa_probe_log`` points at. The runner gives every launch of a probed run a log of its own (sized
from the step), reads it back after the launch and parses its entries; ``placed`` puts a name's entries
on the oracle's axes from where they were written (block, thread, the thread's n-th call), which is how
explain compares an intermediate with the reference's instead of inferring it from the stage's bytes.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

PROBE_DEFINE = "-DCSA_PROBES"
PROBE_SYMBOL = "csa_probe_log"
LOG_HEADER = 4  # words used, words of room, entries dropped, layout version
ENTRY_HEADER = 11  # words, name (6 words), block, thread, count, element bytes
NAME_BYTES = 24
LAYOUT_VERSION = 0  # the log as the runner hands it out; the kernel never writes word 3
# Words of room per element a step's launches could probe (the runner counts each record's and query head's
# probed vectors): an entry's header is small beside its vector, or beside a 64-element block.
ROOM_PER_ELEMENT = 2
MIN_ROOM = 1 << 16
# At most 4 GiB a launch: a longer step's per-record and per-slot probes would outgrow any device's memory (an
# 8K prefill's index dots alone are billions of entries); its log drops entries and says so, never guesses.
MAX_ROOM = 1 << 30


@dataclass(frozen=True)
class ProbeEntry:
    """One CSA_PROBE call: its name, where it ran and its elements' bytes (``ordinal``: the thread's n-th
    call of that name in this launch)."""

    name: str
    block: int
    thread: int
    ordinal: int
    count: int
    size: int
    data: bytes


@dataclass
class ProbeLog:
    """One launch's log read back: its entries, and how many the room could not hold."""

    module: str
    entries: list[ProbeEntry] = field(default_factory=list)
    dropped: int = 0

    def named(self, name: str) -> list[ProbeEntry]:
        return [entry for entry in self.entries if entry.name == name]


def empty_log(room: int) -> np.ndarray:
    """The log a launch is given: the header, then ``room`` words for entries."""
    log = np.zeros(LOG_HEADER + room, dtype=np.uint32)
    log[1] = room
    log[3] = LAYOUT_VERSION
    return log


def room_for(elements: int) -> int:
    """Words of room for a step whose probed tensors hold about ``elements`` elements."""
    return min(MAX_ROOM, max(MIN_ROOM, ROOM_PER_ELEMENT * elements))


def parse(module: str, words: np.ndarray) -> ProbeLog:
    """The entries of a log read back, in the order they were written; a malformed entry ends the walk."""
    words = np.asarray(words, dtype=np.uint32)
    used = min(int(words[0]), int(words[1]), words.size - LOG_HEADER)
    log = ProbeLog(module, dropped=int(words[2]))
    body = words[LOG_HEADER: LOG_HEADER + used]
    raw = body.tobytes()
    calls: dict[tuple[str, int, int], int] = defaultdict(int)
    at = 0
    while at + ENTRY_HEADER <= used:
        length = int(body[at])
        if length < ENTRY_HEADER or at + length > used:
            break
        name = raw[4 * (at + 1): 4 * (at + 1) + NAME_BYTES].split(b"\0", 1)[0].decode("ascii", "replace")
        block, thread, count, size = (int(value) for value in body[at + 7: at + 11])
        start = 4 * (at + ENTRY_HEADER)
        data = raw[start: start + count * size]
        key = (name, block, thread)
        log.entries.append(ProbeEntry(name, block, thread, calls[key], count, size, data))
        calls[key] += 1
        at += length
    return log


class ProbeRecorder:
    """A probed step's logs, one per launch: ``arm`` before a launch, ``collect`` after it."""

    def __init__(self, room: int):
        self.room = room
        self.logs: list[ProbeLog] = []

    def arm(self, backend, module, function):
        """A fresh log bound to the module's csa_probe_log (None when the module declares no probes)."""
        buffer = backend.upload(empty_log(self.room))
        return buffer if backend.bind_probe_log(module, function, buffer) else None

    def collect(self, backend, module, function, buffer) -> None:
        if buffer is None:
            return
        backend.bind_probe_log(module, function, None)
        self.logs.append(parse(module.module, backend.download(buffer)))


# Where a launch's thread computes its units, in the order of its calls: (block, thread) -> unit coordinates.
Units = Callable[[int, int], Sequence[tuple[int, ...]]]


def compressor_units(records: int) -> Units:
    """A compression launch: block b's thread 0 walks the step, its n-th record is record n of row b."""
    return lambda block, thread: [(block, record) for record in range(records)] if thread == 0 else []


def query_units(sequence: int, heads: int, threads: int) -> Units:
    """Index select: block b·S + s finalizes its query heads strided over the block's threads."""
    return lambda block, thread: [(block // sequence, block % sequence, head)
                                  for head in range(thread, heads, threads)]


def attention_units(sequence: int, heads: int) -> Units:
    """An attention launch: block (b·S + s)·N + h's thread 0 computes that row's softmax."""
    return lambda block, thread: [(block // (sequence * heads), block // heads % sequence, block % heads)] \
        if thread == 0 else []


def scored_record_units(sequence: int, limits: Sequence[int] | np.ndarray, threads: int) -> Units:
    """Index select's scoring: block b·S + s scores its causal records c < limits[s] strided over the block's
    threads, each record on one thread (a call per index head for a per-head probe)."""
    return lambda block, thread: [(block // sequence, block % sequence, record)
                                  for record in range(thread, int(limits[block % sequence]), threads)]


def softmax_slot_units(sequence: int, heads: int, threads: int, computed: np.ndarray, tile: int = 256) -> Units:
    """An attention launch's probabilities: block (b·S + s)·N + h computes them a tile of ``tile`` slots at a
    time, slot ``first + j`` on thread ``j mod blockDim``, for the slots ``computed`` [B, S, N, C] marks (a
    valid candidate of a row that has one)."""
    slots = computed.shape[-1]

    def units(block: int, thread: int) -> list[tuple[int, ...]]:
        row = (block // (sequence * heads), block // heads % sequence, block % heads)
        return [row + (slot,) for first in range(0, slots, tile)
                for slot in range(first + thread, first + min(tile, slots - first), threads) if computed[row + (slot,)]]

    return units


def placed(entries: Sequence[ProbeEntry], units: Units, unit_shape: tuple[int, ...], dtype,
           computed: np.ndarray | None = None) -> np.ndarray | str:
    """A name's entries on the units' axes: [*unit_shape, calls per unit, elements], or why they cannot be
    (entries the units do not account for, calls that copy different counts or element sizes). ``computed``
    marks the units the launch computes where it does not compute all (the units name no other); the rest
    hold 0, as the oracle's intermediates do there."""
    dtype = np.dtype(dtype)
    computed = np.ones(unit_shape, dtype=bool) if computed is None else np.asarray(computed, dtype=bool)
    counts = {entry.count for entry in entries}
    sizes = {entry.size for entry in entries}
    if len(counts) != 1 or sizes != {dtype.itemsize}:
        return f"its calls copy {sorted(counts)} elements of {sorted(sizes)} bytes"
    (count,) = counts
    total = int(computed.sum())
    if not total or len(entries) % total:
        return f"{len(entries)} calls for {total} units"
    per = len(entries) // total
    by_thread: dict[tuple[int, int], list[ProbeEntry]] = defaultdict(list)
    for entry in entries:
        by_thread[(entry.block, entry.thread)].append(entry)
    out = np.zeros((computed.size * per, count), dtype=dtype)
    filled = ~np.repeat(computed.reshape(-1), per)
    for (block, thread), calls in by_thread.items():
        mine = units(block, thread)
        if len(calls) != per * len(mine):
            return f"block {block} thread {thread} made {len(calls)} calls for {len(mine)} units of {per} calls"
        for call in calls:
            unit = mine[call.ordinal // per]
            if any(not 0 <= index < extent for index, extent in zip(unit, unit_shape)):
                return f"block {block} thread {thread} wrote unit {unit}, outside {unit_shape}"
            row = int(np.ravel_multi_index(unit, unit_shape)) * per + call.ordinal % per
            out[row] = np.frombuffer(call.data, dtype=dtype, count=count)
            filled[row] = True
    if not filled.all():
        return f"{int((~filled).sum())} of {total * per} calls are missing"
    return out.reshape(tuple(unit_shape) + (per, count))
