"""Arrays hashed and compressed where their case is made, then copied into the file where HDF5 would put them.

``store_case`` runs in the process that built the case (a ``--jobs`` worker):
every distinct array gets its sha256 and, when the file compresses it, its
chunks run through the dataset's own filter pipeline (shuffle, gzip or lzf:
HDF5 itself, in a scratch in-memory file), so the process writing the file
only copies bytes (``write_direct_chunk``) and a worker sends compressed
chunks instead of raw arrays. lzf chunks (the large arrays: nearly all of
the prod suite's bytes) are filtered on every core (csa_conform.golden.lzf),
gzip ones by HDF5 in a scratch file.

Same bytes in the chunks is not yet the same file: a filtered write goes
through the dataset's raw-data chunk cache, and a chunk gets its file space
when the cache writes it, which is either while the array is being written
(an evicted chunk, a chunk larger than the cache) or when the file is
flushed (what is still cached). ``ChunkCache`` replays that cache so every
chunk is copied in at the moment HDF5 would have written it, which keeps
every address, and so every byte of the file, what a plain
``create_dataset(data=...)`` makes (tests/goldens/test_stored_chunks.py
holds the two writes equal).

Why: ``generate --suite prod --jobs 2`` takes 14.8 s, 13.7 CPU s and a 1.0 GB peak this way against 22-24 s,
15.6 CPU s and 1.7 GB with raw arrays piped to the writer's HDF5 (same bytes; on ci it costs ~1 CPU s).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Iterator, Mapping

import h5py
import numpy as np

from csa_conform.golden import lzf
from csa_conform.golden.lzf import chunk_offsets
from csa_conform.golden.digest import array_sha256, little_endian
from csa_conform.golden.layout import KV_HISTORY, LIBVER, GoldenCase

__all__ = ["Chunk", "ChunkCache", "StoredArray", "StoredCase", "StoredStep", "store_array", "store_case"]


@dataclass(frozen=True)
class Chunk:
    """One chunk as the filters left it; ``complete`` when it lies wholly inside the array."""

    offset: tuple[int, ...]
    filter_mask: int
    data: bytes
    complete: bool


@dataclass(frozen=True)
class StoredArray:
    """An array as the file stores it: its digest, its dataset options and either its filtered chunks
    or the array itself (an uncompressed dataset, or one the writer's HDF5 is to compress)."""

    dtype: np.dtype
    shape: tuple[int, ...]
    sha256: str
    options: dict
    array: np.ndarray | None = None
    chunks: tuple[Chunk, ...] = ()

    @property
    def key(self) -> tuple:
        """What makes two arrays one dataset of the file (hard-linked)."""
        return (self.sha256, self.dtype.str, self.shape)


@dataclass
class StoredStep:
    inputs: dict[str, StoredArray]
    outputs: dict[str, StoredArray]
    stages: dict[str, dict[str, StoredArray]]
    expect_error: str | None
    window: tuple[int, int] | None


@dataclass
class StoredCase:
    """A GoldenCase with every array stored; a current_kv that is a window of the history is left out."""

    case_id: str
    attrs: dict
    output_names: tuple[str, ...]
    steps: list[StoredStep]
    family: str
    seed: int | None
    description: str
    kv_history: StoredArray | None = None


def store_case(case: GoldenCase, compression, filtered: bool = True) -> StoredCase:
    """Hash every distinct array of ``case`` once and (``filtered``) compress it (``compression``: the
    writer's Compression). Unfiltered, the arrays stay raw and the writer has HDF5 compress them as
    it writes them, which is the cheaper way in the process that writes the file (``--jobs 1``).

    A stream hands one array object to several steps (a step's present_* is the next one's past_*,
    the weights are every step's): each object is hashed once, each distinct content compressed once.
    Hashing runs on a thread ahead of the compression (hashlib releases the GIL; HDF5's filters do
    not need the other core), so its second of a prod case is mostly hidden.
    """
    windows = [history_window(step.inputs, case.kv_history) for step in case.steps]
    kept = [{name: array for name, array in step.inputs.items() if not (window and name == "current_kv")}
            for step, window in zip(case.steps, windows)]
    objects: dict[int, np.ndarray] = {}  # id() of each array of the case (which keeps them alive), in order
    for arrays in _walk(case, kept):
        for array in arrays.values():
            objects.setdefault(id(array), array)
    arrays = [little_endian(array) for array in objects.values()]
    stored: dict[tuple, StoredArray] = {}
    keys: dict[int, tuple] = {}
    filtering = lzf.pool()
    with ThreadPoolExecutor(1, thread_name_prefix="sha256") as hashing, _scratch_file() as scratch:
        in_scratch, on_threads = [], []
        for identity, array, digest in zip(objects, arrays, hashing.map(array_sha256, arrays)):
            key = keys[identity] = (digest, array.dtype.str, array.shape)
            if key not in stored:
                options = compression.options(array)
                raw = not (options and filtered)
                stored[key] = StoredArray(array.dtype, array.shape, digest, options, array=array if raw else None)
                if raw:
                    continue
                if lzf.threaded_options(options):
                    on_threads.append((key, lzf_chunks(array, options, filtering)))
                else:
                    in_scratch.append((key, scratch.create_dataset(str(len(in_scratch)), data=array, **options)))
        scratch.flush()  # read_direct_chunk reads what the file holds, not the chunk cache
        for key, dataset in in_scratch:
            stored[key] = replace(stored[key], chunks=_chunks_of(dataset))
        for key, futures in on_threads:
            stored[key] = replace(stored[key], chunks=tuple(future.result() for future in futures))

    def store(arrays: Mapping[str, np.ndarray]) -> dict[str, StoredArray]:
        return {name: stored[keys[id(array)]] for name, array in arrays.items()}

    steps = [
        StoredStep(
            inputs=store(inputs),
            outputs=store(step.outputs) if step.expect_error is None else {},
            stages={stage: store(payload) for stage, payload in step.stages.items()},
            expect_error=step.expect_error,
            window=window,
        )
        for step, window, inputs in zip(case.steps, windows, kept)
    ]
    history = None if case.kv_history is None else stored[keys[id(case.kv_history)]]
    return StoredCase(
        case.case_id, case.attrs, tuple(case.output_names), steps, case.family, case.seed, case.description, history,
    )


def _walk(case: GoldenCase, kept: list[dict]) -> Iterator[Mapping[str, np.ndarray]]:
    """The case's arrays group by group, in the order the file holds them."""
    if case.kv_history is not None:
        yield {KV_HISTORY: case.kv_history}
    for step, inputs in zip(case.steps, kept):
        yield inputs
        yield from step.stages.values()
        if step.expect_error is None:
            yield step.outputs


def store_array(array: np.ndarray, options: dict, sha256: str) -> StoredArray:
    """``array`` with its chunks filtered by HDF5 under ``options`` (an empty dict: kept as it is)."""
    if not options:
        return StoredArray(array.dtype, array.shape, sha256, options, array=array)
    if lzf.threaded_options(options):
        chunks = tuple(future.result() for future in lzf_chunks(array, options, lzf.pool()))
        return StoredArray(array.dtype, array.shape, sha256, options, chunks=chunks)
    with _scratch_file() as scratch:
        dataset = scratch.create_dataset("array", data=array, **options)
        scratch.flush()
        return StoredArray(array.dtype, array.shape, sha256, options, chunks=_chunks_of(dataset))


def lzf_chunks(array: np.ndarray, options: dict, pool: ThreadPoolExecutor) -> list:
    """Futures of ``array``'s chunks, in chunk order, filtered as HDF5 filters them under ``options``."""
    shape, chunks = array.shape, tuple(options["chunks"])
    offsets = chunk_offsets(shape, chunks)
    itemsize = array.dtype.itemsize if options.get("shuffle") else 1
    lzf_bit = 0b10 if options.get("shuffle") else 0b01  # lzf's place in the pipeline (shuffle first)

    def chunk(index: int) -> Chunk:
        offset = offsets[index]
        complete = _complete(offset, chunks, shape)
        inside = array[tuple(slice(start, start + step) for start, step in zip(offset, chunks))]
        if complete:
            raw = np.ascontiguousarray(inside).reshape(-1).view(np.uint8)
        else:  # HDF5 fills the part of an edge chunk outside the array with zeros (the fill value)
            padded = np.zeros(chunks, dtype=array.dtype)
            padded[tuple(slice(0, extent) for extent in inside.shape)] = inside
            raw = padded.reshape(-1).view(np.uint8)
        shuffled = lzf.shuffle(raw, itemsize)
        compressed = lzf.compress(shuffled)
        if compressed is None:  # incompressible: HDF5 skips the optional lzf filter, stores the shuffled bytes
            return Chunk(offset, lzf_bit, shuffled.tobytes(), complete)
        return Chunk(offset, 0, compressed, complete)

    return [pool.submit(chunk, index) for index in range(len(offsets))]


def _chunks_of(dataset: h5py.Dataset) -> tuple[Chunk, ...]:
    shape, chunks = dataset.shape, dataset.chunks
    return tuple(Chunk(offset, *dataset.id.read_direct_chunk(offset), complete=_complete(offset, chunks, shape))
                 for offset in chunk_offsets(shape, chunks))


def _scratch_file() -> h5py.File:
    """An in-memory file to filter chunks in: one a case (opening one an array cost more than filtering ci)."""
    return h5py.File(f"chunks-{os.getpid()}-{threading.get_ident()}.h5", "w", driver="core", backing_store=False,
                     libver=LIBVER)


def _complete(offset, chunks, shape) -> bool:
    return all(start + step <= extent for start, step, extent in zip(offset, chunks, shape))


def history_window(inputs: Mapping[str, np.ndarray], history: np.ndarray | None) -> tuple[int, int] | None:
    """The rows of the case's kv history that this step's current_kv is, if it is one."""
    current = inputs.get("current_kv")
    total = inputs.get("total_sequence_length")
    if history is None or current is None or total is None or np.ndim(total) != 0 or current.ndim != 3:
        return None
    total = int(total)
    start = total - current.shape[1]
    if start < 0 or start == total or total > history.shape[1]:
        return None
    window = history[:, start:total]
    if window.dtype != current.dtype or window.shape != current.shape or not np.array_equal(
        window.view(np.uint8), np.ascontiguousarray(current).view(np.uint8)
    ):
        return None
    return (start, total)


class ChunkCache:
    """The raw-data chunk caches of a file being written, replayed (HDF5's H5Dchunk.c).

    A filtered whole-array write passes each chunk, in chunk order, through
    its dataset's cache (``nbytes`` of chunks, ``w0``). A chunk larger than
    the cache is written at once. Otherwise room is made first: from the
    oldest entry on, entries wholly written are evicted (written) and, after
    ``w0`` x the entries held have been passed over, any entry; then the chunk
    is cached. Flushing the file writes what is left, dataset by dataset in
    the order they were opened, oldest entry first. Hash-slot collisions
    (8191 slots against the 16 chunks of 0.5-1 MiB a default cache holds at
    most) cannot occur with the writer's chunk shapes and are not replayed.
    Nor is the moment a dataset's chunk index is made: HDF5 makes it at the
    first write of the array, this at the first chunk written. Under the
    writer's file-object driver, which aggregates no metadata, that moves the
    index of a dataset of several chunks that all stay cached until the
    flush; the writer makes none (one chunk up to 8 MiB, beyond that chunks
    of at most 1 MiB against h5py's 1 MiB cache).
    """

    def __init__(self) -> None:
        self._held: list[tuple[h5py.Dataset, list[Chunk]]] = []

    def write(self, dataset: h5py.Dataset, chunks: tuple[Chunk, ...]) -> None:
        """What writing the whole array writes now; the rest waits for ``flush``."""
        _slots, capacity, w0 = dataset.id.get_access_plist().get_chunk_cache()
        size = int(np.prod(dataset.chunks)) * dataset.dtype.itemsize
        held: list[Chunk] = []
        for chunk in chunks:
            if size > capacity:
                _write(dataset, chunk)
                continue
            _make_room(dataset, held, size, capacity, w0)
            held.append(chunk)
        if held:
            self._held.append((dataset, held))

    def flush(self) -> None:
        """Write every chunk still cached, as flushing the file does."""
        for dataset, held in self._held:
            for chunk in held:
                _write(dataset, chunk)
        self._held = []


def _make_room(dataset: h5py.Dataset, held: list[Chunk], size: int, capacity: int, w0: float) -> None:
    """H5D__chunk_cache_prune: preempt until ``size`` more bytes fit (two methods, two cursors)."""
    def over() -> bool:
        return (len(held) + 1) * size > capacity

    countdown = int(len(held) * w0)
    cursors: list[int | None] = [0 if held else None, None]
    order = list(held)  # the list as it was; evicted entries are dropped from ``held``
    while any(cursor is not None for cursor in cursors) and over():
        if countdown == 0:
            cursors[1] = 0
        following = [None if cursor is None or cursor + 1 >= len(order) else cursor + 1 for cursor in cursors]
        for method in (0, 1):
            if not over():
                break
            cursor = cursors[method]
            if cursor is None or order[cursor] not in held:
                continue
            if method == 0 and not order[cursor].complete:
                continue
            chunk = order[cursor]
            for other in (0, 1):
                if cursors[other] == cursor:
                    cursors[other] = None
            held.remove(chunk)
            _write(dataset, chunk)
        cursors = following
        countdown -= 1


def _write(dataset: h5py.Dataset, chunk: Chunk) -> None:
    dataset.id.write_direct_chunk(chunk.offset, chunk.data, chunk.filter_mask)
