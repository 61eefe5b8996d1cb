"""Trust in a timed launch: its outputs poisoned before every repetition and compared with the conformance run.

A kernel that writes nothing on later launches (it caches, or it failed and
left the previous launch's bytes) would look fast and correct over buffers it
did not write. So before every repetition each buffer the launch owns gets
POISON (a byte the conformance run's scratch never held) or its ABI pre-fill
back, copied from a twin made once, and the bytes of timed repetitions are
compared with those the conformance check accepted, bit for bit: a
difference refuses the row, whose times are then never reported.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from csa_conform.bench.recording import StepLaunches
from csa_conform.device.recorder import Owned, RecordedLaunch
from csa_conform.numerics.bits import differing_bits, same_bits

POISON = 0xC3  # never the conformance run's 0xA5


class Guard:
    """The poisoning and the check of a set of launches' owned buffers."""

    def __init__(self, backend, step: StepLaunches, launches: Sequence[RecordedLaunch]):
        self.backend = backend
        self.step = step
        self.launches = list(launches)
        self.owned: list[tuple[RecordedLaunch, Owned]] = []
        seen: set[int] = set()
        for launch in self.launches:
            for owned in launch.owned:
                if id(owned.buffer) not in seen:
                    seen.add(id(owned.buffer))
                    self.owned.append((launch, owned))
        self._twins = [self._twin(owned) for _, owned in self.owned]

    def _twin(self, owned: Owned):
        shape, dtype = tuple(int(extent) for extent in owned.buffer.shape), owned.buffer.dtype
        if owned.fill is None:
            return self.backend.poisoned(shape, dtype, POISON)
        return self.backend.full(shape, owned.fill, dtype)

    def poison(self) -> None:
        for (_, owned), twin in zip(self.owned, self._twins):
            self.backend.copy_into(owned.buffer, twin)

    def restore(self) -> None:
        """Put the conformance run's bytes back (what later rows read as inputs)."""
        for _, owned in self.owned:
            expected = self.step.expected[id(owned.buffer)]
            self.backend.copy_into(owned.buffer, self.backend.upload(expected.view(owned.buffer.dtype).reshape(
                owned.buffer.shape)))

    def mismatch(self, parameters: dict[str, tuple[str, ...]]) -> str | None:
        """None when every owned buffer holds the conformance run's bytes, else what differs first."""
        for launch, owned in self.owned:
            actual = np.ascontiguousarray(self.backend.download(owned.buffer)).reshape(-1).view(np.uint8)
            expected = self.step.expected[id(owned.buffer)]
            if not same_bits(actual, expected):
                differ = np.flatnonzero(differing_bits(actual, expected)) if actual.size == expected.size \
                    else np.array([0])
                names = parameters.get(launch.entry, ())
                name = f" ({names[owned.position]})" if owned.position < len(names) else ""
                first = int(differ[0])
                return (f"argument {owned.position}{name} of {launch.entry} holds other bytes after a timed "
                        f"repetition than after the conformance run ({differ.size} bytes differ, first at byte "
                        f"{first}: 0x{int(expected[first]):02x} -> 0x{int(actual[first]):02x}); a kernel that "
                        "skips or caches its work is not timed")
        return None
