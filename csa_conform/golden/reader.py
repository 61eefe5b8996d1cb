"""Reading a golden file: ``GoldenFile``, the one type every reader of goldens opens.

Opening checks the root and the manifest digest (csa_conform.golden.validation);
the first access to a case indexes and checks it (csa_conform.golden.streams);
every array read is checked against its sha256, each HDF5 object once per
verified case however many steps link it.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Iterator

import h5py
import numpy as np

from csa_conform._base.memory import headroom, require
from csa_conform.errors import CorruptDataset, CsaConformError, GoldenFormatError
from csa_conform.golden.carries import cleared_carry
from csa_conform.golden.checking import IN_TURN, CaseChecks
from csa_conform.golden.layout import WINDOW, CaseInfo, GoldenCase, GoldenStep, TensorEntry
from csa_conform.golden.streams import CaseIndex, CaseIndexer, StepIndex, input_rank
from csa_conform.golden.validation import CheckedFile
from csa_conform.numerics.records import decode_fp4_record, decode_fp8_record
from csa_conform.spec import DECODED_PAYLOADS

# A case smaller than this is read and hashed in the caller's thread, and never read ahead: the
# ci suite's cases (at most about 1 MB each) verified 15% slower on threads.
THREADED_CASE_BYTES = 16 << 20


class GoldenFile:
    """A golden file opened for reading; every array read is checked against its sha256.

    Opening checks the root and (schema 2) the manifest digest; the first
    access to a case checks its layout, its case digest and the declared size
    of every tensor against the case's geometry, before any data is read.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        self._file = CheckedFile(self.path)
        self._cases: dict[str, CaseIndex] = {}
        # The last case whose checksums were verified (or are being): its arrays by HDF5 object,
        # read-only, so replaying it reads and hashes each object once however many steps link it.
        self._checks: CaseChecks | None = None
        self._ahead: tuple[str, CaseChecks] | None = None  # the case read while the last one replays
        self._threads: tuple[ThreadPoolExecutor, ThreadPoolExecutor] | None = None  # reading, hashing
        try:
            self._file.traverse()
            with self._file.guard("/"):
                self.schema_version = self._file.check_root()
                self._case_ids, self.manifest = self._file.check_manifest(self.schema_version)
        except BaseException:
            self.close()
            raise
        self._indexer = CaseIndexer(self._file, self.schema_version)

    def __enter__(self) -> GoldenFile:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        if self._ahead is not None:
            self._ahead[1].close()
            self._ahead = None
        if self._threads is not None:
            for threads in self._threads:
                threads.shutdown(wait=True, cancel_futures=True)
        self._file.close()
        # The index goes with the file: h5py walks every live handle of the process at each file close,
        # so a closed file's index kept alive (a caller's variable) would slow every later close.
        self._cases.clear()
        self._checks = None

    def case_ids(self) -> list[str]:
        return list(self._case_ids)

    def _case(self, case_id: str) -> CaseIndex:
        if case_id not in self._cases:
            if case_id not in self._case_ids:
                raise GoldenFormatError(f"{self.path}: no case {case_id!r}")
            where = f"/cases/{case_id}"
            with self._file.guard(where):
                self._cases[case_id] = self._indexer.index_case(case_id, where)
        return self._cases[case_id]

    def case_info(self, case_id: str) -> CaseInfo:
        return self._case(case_id).info

    def step_count(self, case_id: str) -> int:
        return self._case(case_id).info.step_count

    def _step(self, case_id: str, index: int) -> StepIndex:
        steps = self._case(case_id).steps
        if not 0 <= index < len(steps):
            raise GoldenFormatError(f"{self.path}: case {case_id!r} has {len(steps)} steps; no step {index}")
        return steps[index]

    def step_attrs(self, case_id: str, index: int) -> dict:
        step = self._step(case_id, index)
        attrs = {} if step.expect_error is None else {"expect_error": step.expect_error}
        if step.window is not None:
            attrs[WINDOW] = list(step.window)
        return attrs

    @property
    def provenance(self) -> dict:
        with self._file.guard("/"):
            return self._file.root_attrs()

    def read_inputs(self, case_id: str, index: int) -> dict[str, np.ndarray]:
        """A step's inputs as ``read_step`` hands them out, its outputs and stages unread (a replay
        can start while ``checking_case`` still reads them)."""
        step = self._step(case_id, index)
        inputs = {path.rpartition("/")[2]: self._read_tensor(case_id, step, entry, dataset)
                  for path, (entry, dataset) in step.tensors.items() if path.startswith("inputs/")}
        if step.cleared:
            cleared = {name: cleared_carry(shape) for name, shape in step.cleared.items()}
            inputs = dict(sorted({**inputs, **cleared}.items(), key=input_rank))
        return inputs

    def read_step(self, case_id: str, index: int) -> GoldenStep:
        step = self._step(case_id, index)
        read = GoldenStep(inputs=self.read_inputs(case_id, index), expect_error=step.expect_error)
        for path, (entry, dataset) in step.tensors.items():
            group, _, name = path.rpartition("/")
            if group == "inputs":
                continue
            array = self._read_tensor(case_id, step, entry, dataset)
            if group == "outputs":
                read.outputs[name] = array
            else:
                read.stages.setdefault(group.split("/", 1)[1], {})[name] = array
        for (stage, tensor), cache in DECODED_PAYLOADS.items():
            payload = read.stages.get(stage, {})
            if tensor not in payload and cache in payload:
                payload[tensor] = decoded_payload(stage, payload[cache])
        return read

    def _read_tensor(self, case_id: str, step: StepIndex, entry: TensorEntry, dataset: h5py.Dataset | None):
        return self._read_window(case_id, step) if dataset is None else self._read_verified(entry, dataset)

    def _read_window(self, case_id: str, step: StepIndex) -> np.ndarray:
        case = self._case(case_id)
        if case.history_rows is None:
            case.history_rows = self._read_verified(*case.history)
        start, stop = step.window
        history = case.history_rows
        return np.ascontiguousarray(history[:, start:stop])

    def read_case(self, case_id: str) -> GoldenCase:
        info = self.case_info(case_id)
        return GoldenCase(
            case_id=case_id,
            attrs=info.attrs,
            output_names=info.output_names,
            steps=[self.read_step(case_id, index) for index in range(info.step_count)],
            family=info.family,
            seed=info.seed,
            description=info.description,
        )

    def case_bytes(self, case_id: str) -> int:
        """Bytes of the case's distinct datasets as declared (what verifying it holds in memory), unread."""
        return _declared_bytes(self._datasets(case_id))

    def _datasets(self, case_id: str) -> dict[int, list[tuple[TensorEntry, h5py.Dataset]]]:
        """The case's distinct datasets by HDF5 address, each with every link to it, in file order
        (the steps' tensors, then the kv history)."""
        case = self._case(case_id)
        pairs = [pair for step in case.steps for pair in step.tensors.values() if pair[1] is not None]
        if case.history is not None:
            pairs.append(case.history)
        datasets: dict[int, list] = {}
        for entry, dataset in pairs:
            with self._file.guard(dataset.name):
                datasets.setdefault(h5py.h5o.get_info(dataset.id).addr, []).append((entry, dataset))
        return datasets

    def verify_case_checksums(self, case_id: str) -> int:
        """Check every dataset of a case once (kv history and hard links included); returns the count."""
        with self.checking_case(case_id) as checks:
            return checks.wait()

    @contextmanager
    def checking_case(self, case_id: str, what: str | None = None) -> Iterator[CaseChecks]:
        """Every dataset of a case read and checked on threads while the caller goes on: reading a
        step of the case waits for its datasets only, and whichever the caller waits for, what it is
        handed is the first failure in file order (csa_conform.golden.checking). ``wait()`` on the
        yielded checks requires all of them; leaving stops the threads. With ``what``, the memory
        the case's arrays take is required first under that name (``read_ahead`` required it)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == case_id:
            self._checks = ahead[1]
        else:
            if ahead is not None:
                ahead[1].close()
            if what is not None:
                require(self.case_bytes(case_id), what)
            self._checks = self._case_checks(case_id)
        try:
            yield self._checks
        finally:
            self._checks.close()

    def read_ahead(self, case_id: str, after: str) -> None:
        """Start reading ``case_id`` behind the case ``after`` being checked, so that it is read
        while ``after`` replays, when the memory is there for both twice over (their arrays and what
        replaying them makes); ``checking_case(case_id)`` takes it over. A case that cannot be
        indexed is left to its turn, which reports it."""
        try:
            size, current = self.case_bytes(case_id), self.case_bytes(after)
        except CsaConformError:
            return
        bound = headroom()
        if size >= THREADED_CASE_BYTES and (bound is None or 2 * (current + size) <= bound[0]):
            self._ahead = (case_id, self._case_checks(case_id, ahead=True))

    def _case_checks(self, case_id: str, ahead: bool = False) -> CaseChecks:
        history, first = self._case(case_id).history, None
        if history is not None:  # last in file order, read first: the first step's current_kv is a window of it
            with self._file.guard(history[1].name):
                first = h5py.h5o.get_info(history[1].id).addr
        datasets = self._datasets(case_id)
        if _declared_bytes(datasets) < THREADED_CASE_BYTES:
            return CaseChecks(self._file, datasets, first, self._named, IN_TURN, IN_TURN)
        if self._threads is None:
            self._threads = (ThreadPoolExecutor(1, thread_name_prefix="read"),
                             ThreadPoolExecutor(1, thread_name_prefix="sha256"))
        return CaseChecks(self._file, datasets, first, self._named, *self._threads, ahead=ahead)

    def _named(self, corrupt: CorruptDataset, links: list) -> CorruptDataset:
        """``corrupt`` naming every link to the damaged dataset."""
        names = tuple(sorted({dataset.name for _, dataset in links}))
        also = [name for name in names if name != corrupt.dataset]
        reason = f"{corrupt.reason}; the same dataset is also {', '.join(also)}" if also else corrupt.reason
        return CorruptDataset(self.path, corrupt.dataset, reason, names)

    def cleared_carries(self, case_id: str, index: int) -> tuple[str, ...]:
        """The carries a step from position 0 omits, which ``read_step`` hands out cleared."""
        return tuple(self._step(case_id, index).cleared)

    def dataset_entries(self, case_id: str, index: int) -> list[tuple[str, TensorEntry]]:
        """(step-relative path, entry) of one step, unread: inputs, stages, outputs.

        Inputs come in positional order; stages and outputs in creation order
        (pipeline order) in files this package writes, which track it; other
        files list them by name.
        """
        return [(path, entry) for path, (entry, _) in self._step(case_id, index).tensors.items()]

    def read_dataset(self, case_id: str, index: int, path: str) -> np.ndarray:
        """One tensor of a step, refused unless its bytes match its checksum."""
        step = self._step(case_id, index)
        if path not in step.tensors:
            raise GoldenFormatError(f"{self.path}: step {index} of {case_id!r} has no tensor {path}")
        entry, dataset = step.tensors[path]
        return self._read_window(case_id, step) if dataset is None else self._file.read(entry, dataset)

    def _read_verified(self, entry: TensorEntry, dataset: h5py.Dataset) -> np.ndarray:
        """The array checking_case read and checked (waiting for it), else read and check it now."""
        with self._file.guard(dataset.name):
            address = h5py.h5o.get_info(dataset.id).addr
        checks = self._checks
        return checks.array(address) if checks is not None and checks.covers(address) else self._file.read(entry, dataset)


def _declared_bytes(datasets: dict[int, list[tuple[TensorEntry, h5py.Dataset]]]) -> int:
    return sum(links[0][0].nbytes for links in datasets.values())


def decoded_payload(stage: str, cache: np.ndarray) -> np.ndarray:
    """The logical rows of a stored cache: FP8 hybrid or FP4 records decoded, an f32 cache as it is."""
    if stage == "index_key_update":
        return decode_fp4_record(cache)
    return decode_fp8_record(cache) if cache.dtype == np.uint8 else cache.copy()
