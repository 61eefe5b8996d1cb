"""A case's datasets read and checked against their digests behind the caller, so a replay starts
as soon as the datasets it reads are checked, while the rest is still being read.

One thread reads the datasets (their lzf chunks on every core), another hashes each one read; the
caller waits only for the arrays it asks for. The kv history is read first, since the first step
takes its current_kv from it, but failures keep the order the datasets are listed in (the steps',
then the history): whatever the caller asks for, the failure it is handed is the first in that
order, as when each dataset was read and hashed in turn. An unreadable dataset ends the reading of
those listed after it; a dataset that fails its own read or digest cannot be asked for twice
differently.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from csa_conform.errors import CorruptDataset
from csa_conform.golden.validation import CheckedFile

__all__ = ["CaseChecks"]


class _NotRead(Exception):
    """Listed after a dataset that could not be read: never reported, the earlier failure is."""


class CaseChecks:
    """Every distinct dataset of one case, by HDF5 address in the order failures are reported,
    each read and checked once on this object's threads (``close`` stops them)."""

    def __init__(self, file: CheckedFile, datasets: dict[int, list], first: int | None, named):
        self._file = file
        self._links = datasets
        self._order = list(datasets)
        self._position = {address: position for position, address in enumerate(self._order)}
        self._named = named
        self._stopped_at: int | None = None  # position of the first dataset that could not be read
        self._checked = 0  # every dataset before this position passed
        self.arrays: dict[int, np.ndarray] = {}  # checked, read-only
        self._reading = ThreadPoolExecutor(1, thread_name_prefix="read")
        self._hashing = ThreadPoolExecutor(1, thread_name_prefix="sha256")
        reading = self._order if first is None else [first] + [address for address in self._order if address != first]
        self._read: dict[int, Future] = {address: self._reading.submit(self._read_one, address) for address in reading}
        self._closed = False

    def __len__(self) -> int:
        return len(self._order)

    def _read_one(self, address: int) -> tuple[np.ndarray, Future]:
        position = self._position[address]
        if self._stopped_at is not None and position > self._stopped_at:
            raise _NotRead
        entry, dataset = self._links[address][0]
        try:
            array = self._file.read_unchecked(entry, dataset)
        except BaseException:
            self._stopped_at = position if self._stopped_at is None else min(self._stopped_at, position)
            raise
        return array, self._hashing.submit(self._file.check_digest, entry, dataset, array)

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
            array, digest = self._read[address].result()
            digest.result()
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
        self._reading.shutdown(wait=True, cancel_futures=True)
        self._hashing.shutdown(wait=True, cancel_futures=True)
