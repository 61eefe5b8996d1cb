"""A case's datasets read and checked against their digests behind the caller, so a replay starts
as soon as the datasets it reads are checked, while the rest is still being read.

One thread reads the datasets (their lzf chunks on every core), another hashes each one read; the
caller waits only for the arrays it asks for. The kv history is read first, since the first step
takes its current_kv from it, but failures keep the order the datasets are listed in (the steps',
then the history): whatever the caller asks for, the failure it is handed is the first in that
order, as when each dataset was read and hashed in turn. An unreadable dataset ends the reading of
those listed after it. The threads are the file's (``GoldenFile``), shared by its cases in turn, so
the next case can be read while the last one replays.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor, wait

import numpy as np

from csa_conform.errors import CorruptDataset, MemoryShortage
from csa_conform.golden.validation import CheckedFile

__all__ = ["IN_TURN", "CaseChecks"]


class _InTurn:
    """Runs each task as it is submitted, in the caller's thread: for a small case, where handing
    every dataset to a thread and back costs more than reading and hashing it."""

    def submit(self, function, *args) -> Future:
        future: Future = Future()
        try:
            future.set_result(function(*args))
        except Exception as error:  # a Ctrl-C is not a dataset's failure: it goes on up
            future.set_exception(error)
        return future


IN_TURN = _InTurn()


class _NotRead(Exception):
    """Listed after a dataset that could not be read: never reported, the earlier failure is."""


class CaseChecks:
    """Every distinct dataset of one case, by HDF5 address in the order failures are reported,
    each read on ``reading`` and hashed on ``hashing`` once (``close`` stops what is left)."""

    def __init__(self, file: CheckedFile, datasets: dict[int, list], first: int | None, named,
                 reading: ThreadPoolExecutor | _InTurn, hashing: ThreadPoolExecutor | _InTurn, ahead: bool = False):
        self._file = file
        self._links = datasets
        self._order = list(datasets)
        self._position = {address: position for position, address in enumerate(self._order)}
        self._named = named
        self._stopped_at: int | None = None  # position of the first dataset that could not be read
        self._checked = 0  # every dataset before this position passed
        self.arrays: dict[int, np.ndarray] = {}  # checked, read-only
        self._hashing = hashing
        self._ahead = ahead  # read while the last case replays: a read short of memory is retried in turn
        self._digests: list[Future] = []
        self._closed = False
        order = self._order if first is None else [first] + [address for address in self._order if address != first]
        self._read: dict[int, Future] = {address: reading.submit(self._read_one, address) for address in order}

    def _read_one(self, address: int) -> tuple[np.ndarray, Future]:
        position = self._position[address]
        if self._stopped_at is not None and position > self._stopped_at:
            raise _NotRead
        entry, dataset = self._links[address][0]
        try:
            array = self._file.read_unchecked(entry, dataset)
        except MemoryShortage:
            if not self._ahead:
                self._stopped_at = position if self._stopped_at is None else min(self._stopped_at, position)
            raise
        except BaseException:
            self._stopped_at = position if self._stopped_at is None else min(self._stopped_at, position)
            raise
        digest = self._hashing.submit(self._file.check_digest, entry, dataset, array)
        self._digests.append(digest)
        return array, digest

    def covers(self, address: int) -> bool:
        """Whether ``array(address)`` serves this dataset (checked, or still to be while open)."""
        return address in self.arrays or (not self._closed and address in self._position)

    def array(self, address: int) -> np.ndarray:
        """The dataset's checked array, once its own read and digest are done; when they failed, the
        first failure in order (this one or an earlier one) is raised."""
        if address not in self.arrays:
            try:
                self._own(address)
            except Exception:
                self._through(self._position[address])
                raise
        return self.arrays[address]

    def wait(self) -> int:
        """Every dataset checked, or the first failure in order raised; returns how many there are."""
        self._through(len(self._order) - 1)
        return len(self._order)

    def _own(self, address: int) -> None:
        try:
            try:
                array, digest = self._read[address].result()
                digest.result()
            except MemoryShortage:
                if not self._ahead:
                    raise
                array = self._file.read(*self._links[address][0])
        except CorruptDataset as corrupt:
            raise self._named(corrupt, self._links[address]) from None
        array.flags.writeable = False
        self.arrays[address] = array

    def _through(self, position: int) -> None:
        while self._checked <= position:
            address = self._order[self._checked]
            if address not in self.arrays:
                self._own(address)
            self._checked += 1

    def close(self) -> None:
        """Stop: the read and the hash running end, none starts (on an error or Ctrl-C as well)."""
        self._closed = True
        self._stopped_at = -1
        for future in [*self._read.values(), *self._digests]:
            future.cancel()
        wait([*self._read.values(), *self._digests])
