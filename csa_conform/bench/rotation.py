"""Rotated inputs for hot samples: several copies of a row's inputs, the next copy at each repetition.

A hot sample (``--mode hot``: no L2 flush; a launch alone or the whole step as one CUDA graph) that
reads the very addresses the previous repetition read finds those inputs in the L2 and times a launch
no model ever runs: real layers read inputs the previous launch did not. With ``copies`` copies
cycled, what rotation buys is exactly this: a repetition reads its inputs at addresses last read
``copies - 1`` repetitions before, and when the copies together hold at least ROTATE_FACTOR times the
L2 (``exceeds_cache``), the other copies' reads have evicted them since, so the inputs come from
memory while instruction cache, TLBs, clocks and launch path stay warm. It buys nothing more: the
buffers a launch writes stay the same (the trust check compares them, csa_conform.bench.trust) and
were rewritten by the poisoning just before; inputs produced inside the step (one launch's output
read by the next) are not copied; and when MAX_COPIES copies still fit in the L2
(``exceeds_cache`` false) the inputs stay resident, as the row says. A row whose inputs alone hold
ROTATE_FACTOR times the L2 gets one copy: the previous repetition's inputs are gone anyway.

Copies are byte-for-byte copies made once per row (a host round trip), so the conformance run's
bytes are what every copy's launch must write.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np

from csa_conform.device.recorder import RecordedLaunch

ROTATE_FACTOR = 2  # as the cold flush buffer: twice the L2
MAX_COPIES = 64


@dataclass(frozen=True)
class Rotation:
    """A row's input copies: how many, the bytes of one set, and whether all of them outgrow the L2."""

    copies: int
    input_bytes: int
    exceeds_cache: bool

    def to_dict(self) -> dict:
        return {"copies": self.copies, "input_bytes": self.input_bytes, "exceeds_cache": self.exceeds_cache}


def _is_buffer(arg) -> bool:
    return hasattr(arg, "shape") and hasattr(arg, "dtype") and not isinstance(arg, np.generic)


def _nbytes(buffer) -> int:
    return int(np.prod(buffer.shape, dtype=np.int64)) * np.dtype(buffer.dtype).itemsize


def inputs(launches: Sequence[RecordedLaunch]) -> list:
    """The buffers the launches read and none of them writes, each once."""
    written = {id(owned.buffer) for launch in launches for owned in launch.owned}
    found: dict[int, object] = {}
    for launch in launches:
        for arg in launch.args:
            if _is_buffer(arg) and id(arg) not in written:
                found.setdefault(id(arg), arg)
    return list(found.values())


def copies_for(input_bytes: int, cache_bytes: int) -> int:
    """Copies so that all of them hold ROTATE_FACTOR × the cache (one when one set does; MAX_COPIES at most)."""
    if input_bytes <= 0:
        return 1
    return max(1, min(MAX_COPIES, math.ceil(ROTATE_FACTOR * cache_bytes / input_bytes)))


def rotated(backend, launches: Sequence[RecordedLaunch], cache_bytes: int) -> tuple[list[list[RecordedLaunch]], Rotation]:
    """The launches once per copy (the first on the recorded buffers), and what the rotation is."""
    originals = inputs(launches)
    input_bytes = sum(_nbytes(buffer) for buffer in originals)
    count = copies_for(input_bytes, cache_bytes)
    variants = [list(launches)]
    for _ in range(count - 1):
        twin = {id(buffer): backend.upload(backend.download(buffer)) for buffer in originals}
        variants.append([replace(launch, args=tuple(twin.get(id(arg), arg) for arg in launch.args))
                         for launch in launches])
    return variants, Rotation(count, input_bytes, count * input_bytes >= ROTATE_FACTOR * cache_bytes)


def cycled(issues: Sequence[Callable[[], None]]) -> Callable[[], None]:
    """One repetition per call, each on the next copy in turn."""
    if len(issues) == 1:
        return issues[0]
    turn = itertools.cycle(issues)
    return lambda: next(turn)()
