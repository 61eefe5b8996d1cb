"""Writing a golden file: byte-reproducible, identical arrays stored once, the file whole or absent.

Cases are written in the order given with a fixed attribute order and no
timestamps; identical arrays are hard-linked; a current_kv that is a window
of the case's kv history is stored as the window's rows, not a copy.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Mapping

import h5py
import numpy as np

from csa_conform import ORACLE_VERSION, __version__
from csa_conform._base.atomic import atomic_file
from csa_conform.errors import GoldenFormatError, GoldenWriteError, UsageError
from csa_conform.golden.chunks import ChunkCache, StoredArray, StoredCase, store_case
from csa_conform.golden.digest import case_digest, manifest_digest
from csa_conform.golden.layout import (
    CASE_DIGEST,
    CONTRACT,
    FORMAT,
    KV_HISTORY,
    LIBVER,
    MANIFEST_DIGEST,
    SCHEMA_VERSION,
    WINDOW,
    GoldenCase,
    TensorEntry,
)
from csa_conform.golden.validation import attr_value, first_line


@dataclass(frozen=True)
class Compression:
    """h5py filter settings for datasets of at least ``min_bytes``.

    Measured on the ci suite: gzip level 4 with byte shuffle (which groups
    the zero low bytes of bf16-valued floats) stores its arrays in an eighth
    of their raw size. One chunk per dataset (up to ``max_chunk_bytes``)
    makes the file 15% smaller than h5py's default chunks: gzip sees the
    whole array and the chunk index is a single address. gzip 1 is 3% and
    lzf 23% larger; gzip 9 gains 2% but writes full-precision arrays 2.5
    times slower. Datasets under 256 bytes stay contiguous, as a hex editor
    shows them. Datasets of ``large_bytes`` or more (none in the ci suite,
    whose largest is 1 MiB; the prod suite's caches and carries of up to
    128 MiB) use lzf: gzip spent 22 of the 38 s of ``generate --suite prod``.
    Arrays over ``max_chunk_bytes`` are cut into chunks of about
    ``large_chunk_bytes`` of whole trailing rows: h5py's own guess makes
    64 KiB chunks, which lzf writes at half the speed.
    """

    codec: str | None = "gzip"
    level: int | None = 4
    shuffle: bool = True
    min_bytes: int = 256
    max_chunk_bytes: int = 8 << 20
    large_bytes: int = 4 << 20
    large_codec: str = "lzf"
    large_chunk_bytes: int = 1 << 20

    def options(self, array: np.ndarray) -> dict:
        if self.codec is None or array.ndim == 0 or array.size == 0 or array.nbytes < self.min_bytes:
            return {}
        chunks = array.shape
        if array.nbytes > self.max_chunk_bytes:
            chunks = _chunk_shape(array.shape, array.dtype.itemsize, self.large_chunk_bytes)
        codec = self.large_codec if array.nbytes >= self.large_bytes else self.codec
        options = {"compression": codec, "shuffle": self.shuffle, "chunks": chunks}
        if codec == "gzip":
            options["compression_opts"] = self.level
        return options


def _chunk_shape(shape: tuple[int, ...], itemsize: int, target_bytes: int) -> tuple[int, ...]:
    """Whole trailing axes, then as many rows of the next axis as fit in target_bytes (at least one)."""
    chunk, inner = list(shape), itemsize
    for axis in reversed(range(len(shape))):
        if inner * shape[axis] > target_bytes:
            chunk[axis] = max(1, target_bytes // inner)
            chunk[:axis] = [1] * axis
            break
        inner *= shape[axis]
    return tuple(chunk)



def write_goldens(
    path: str | os.PathLike,
    cases: Iterable[GoldenCase | StoredCase],
    *,
    force: bool = False,
    compression: Compression = Compression(),
    provenance: Mapping[str, str | int] | None = None,
) -> int:
    """Write ``cases`` (consumed lazily, in the order given) and return how many were written.

    A GoldenCase is hashed here and compressed by HDF5 as it is written, under ``compression``; a
    StoredCase (``store_case``, run where the case was made) arrives hashed and compressed already,
    and its chunks are copied in where HDF5 would have written them: a file of StoredCases is the
    bytes the same GoldenCases give (one that mixes the two is valid, its layout another). The file appears under ``path`` only once
    complete; anything that stops the write (an error, a full disk, Ctrl-C, SIGTERM) leaves no file
    and no temporary behind, and without ``force`` an existing file is never replaced.
    """
    path = Path(path)
    if path.exists() and not force:
        raise UsageError(f"{path} exists; pass --force to overwrite it")
    digests: dict[str, str] = {}
    with atomic_file(path, replace=force) as handle:
        sink = FileSink(handle)
        try:
            _write_file(sink, cases, compression, provenance or {}, digests)
        except Exception:
            sink.raise_failure(path)
            raise
        sink.raise_failure(path)
    return len(digests)


def _write_file(
    sink: FileSink, cases: Iterable[GoldenCase | StoredCase], compression: Compression,
    provenance: Mapping[str, str | int], digests: dict,
) -> None:
    """HDF5 writes the file straight into ``sink`` (h5py's file-object driver) as the cases arrive;
    fills ``digests`` (case id -> case_sha256). A failed write stops at the next case."""
    stored: dict[tuple, h5py.Dataset] = {}
    cache = ChunkCache()
    with h5py.File(sink, "w", libver=LIBVER) as handle:
        _write_root(handle, provenance)
        root = handle.create_group("cases")
        for case in cases:
            if sink.failure is not None:
                return
            if isinstance(case, GoldenCase):
                case = store_case(case, compression, filtered=False)
            if case.case_id in digests:
                raise GoldenFormatError(f"case id {case.case_id!r} appears twice")
            digests[case.case_id] = _write_case(root, case, stored, cache)
        root_attrs = {key: attr_value(value) for key, value in handle.attrs.items()}
        handle.attrs[MANIFEST_DIGEST] = manifest_digest(root_attrs, digests)
        cache.flush()


class FileSink:
    """The file as h5py's file-object driver sees it: positioned writes and reads on the descriptor.

    A write that fails (a full disk, a file size limit) is remembered, not reported: HDF5 carries
    on as if it had succeeded and closes cleanly, where a failed write of its own would leave its
    close and the library's shutdown to crash the process. The writer then stops and reports the
    remembered failure; the file is discarded either way. Writing in place, not through an image
    built in memory and copied out, spares the file's size in fresh memory twice, which on this
    project's VMs cost more system time than all of generate's compression.
    """

    def __init__(self, output) -> None:
        self._descriptor = output.fileno()
        self._position = 0
        self._end = 0
        self.failure: OSError | None = None

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self._position = {os.SEEK_SET: 0, os.SEEK_CUR: self._position, os.SEEK_END: self._end}[whence] + offset
        return self._position

    def tell(self) -> int:
        return self._position

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        size, offset = len(view), self._position
        while view and self.failure is None:
            try:
                written = os.pwrite(self._descriptor, view, offset)
            except OSError as error:
                self.failure = error
                break
            view, offset = view[written:], offset + written
        self._position += size
        self._end = max(self._end, self._position)
        return size

    def readinto(self, buffer) -> int:
        """Bytes past the end, and any a failed write left unwritten, read as zeros (as HDF5's own
        drivers read past the end of a file)."""
        view = memoryview(buffer).cast("B")
        size = min(len(view), max(0, self._end - self._position))
        got = os.preadv(self._descriptor, [view[:size]], self._position) if size else 0
        view[got:] = bytes(len(view) - got)
        self._position += size
        return size

    def read(self, size: int = -1) -> bytes:
        buffer = bytearray(max(0, self._end - self._position) if size < 0 else size)
        return bytes(buffer[:self.readinto(buffer)])

    def truncate(self, size: int | None = None) -> int:
        size = self._position if size is None else size
        if self.failure is None:
            try:
                os.ftruncate(self._descriptor, size)
            except OSError as error:
                self.failure = error
        self._end = size
        return size

    def flush(self) -> None:
        pass

    def raise_failure(self, path: Path) -> None:
        if self.failure is not None:
            with _write_errors(path):
                raise self.failure


@contextmanager
def _write_errors(path: Path) -> Iterator[None]:
    """A full disk or a file size limit is one GoldenWriteError, not a traceback."""
    try:
        yield
    except (OSError, RuntimeError) as error:
        raise GoldenWriteError(f"{path}: cannot write ({first_line(error)}); nothing written") from None


def _write_root(handle: h5py.File, provenance: Mapping[str, str | int]) -> None:
    handle.attrs["format"] = FORMAT
    handle.attrs["schema_version"] = np.int64(SCHEMA_VERSION)
    handle.attrs["created_by"] = f"csa-conform {__version__}"
    handle.attrs["oracle_version"] = str(ORACLE_VERSION)
    handle.attrs["numpy_version"] = np.__version__
    handle.attrs["contract"] = CONTRACT
    for key, value in provenance.items():
        handle.attrs[key] = value


def _check_case_id(case_id: str) -> None:
    if not case_id or "/" in case_id or case_id in (".", "..") or not case_id.isprintable():
        raise GoldenFormatError(f"case id {case_id!r} cannot name an HDF5 group")


def _write_case(root: h5py.Group, case: StoredCase, stored: dict, cache: ChunkCache) -> str:
    """Write one case; returns its case_sha256."""
    _check_case_id(case.case_id)
    group = root.create_group(case.case_id)
    history = None
    if case.kv_history is not None:
        history = _write_arrays(group, {KV_HISTORY: case.kv_history}, "", stored, cache)[0]
    steps = group.create_group("steps")
    described = []
    for index, step in enumerate(case.steps):
        node = steps.create_group(f"{index:04d}")
        if step.expect_error is not None:
            node.attrs["expect_error"] = step.expect_error
        if step.window is not None:
            node.attrs[WINDOW] = np.array(step.window, dtype=np.int64)
        # Not creation-ordered: readers list inputs in positional order anyway, and order
        # tracking makes a group of ~20 links 0.7 KB larger.
        tensors = _write_arrays(node.create_group("inputs"), step.inputs, "inputs/", stored, cache)
        if step.stages:
            stages = node.create_group("stages", track_order=True)
            for stage, payload in step.stages.items():
                group_of_stage = stages.create_group(stage, track_order=True)
                tensors += _write_arrays(group_of_stage, payload, f"stages/{stage}/", stored, cache)
        if step.expect_error is None:
            outputs = node.create_group("outputs", track_order=True)
            tensors += _write_arrays(outputs, step.outputs, "outputs/", stored, cache)
        described.append((step.expect_error, step.window, tensors))
    attrs_json = json.dumps(case.attrs, sort_keys=True)
    names_json = json.dumps(list(case.output_names))
    group.attrs["attrs_json"] = attrs_json
    group.attrs["output_names_json"] = names_json
    group.attrs["family"] = case.family
    if case.seed is not None:
        group.attrs["seed"] = np.int64(case.seed)
    group.attrs["description"] = case.description
    digest = case_digest(
        case.case_id, json.loads(attrs_json), json.loads(names_json), case.family,
        None if case.seed is None else int(case.seed), case.description, history, described,
    )
    group.attrs[CASE_DIGEST] = digest
    return digest


def _write_arrays(
    group, arrays: Mapping[str, StoredArray], prefix: str, stored: dict, cache: ChunkCache
) -> list[TensorEntry]:
    written = []
    for name, array in arrays.items():
        if array.key in stored:
            group[name] = stored[array.key]
        else:
            if array.chunks:
                dataset = group.create_dataset(name, shape=array.shape, dtype=array.dtype, **array.options)
                cache.write(dataset, array.chunks)
            else:
                dataset = group.create_dataset(name, data=array.array, **array.options)
            dataset.attrs["sha256"] = array.sha256
            stored[array.key] = dataset
        written.append(TensorEntry(prefix + name, array.dtype, array.shape, array.sha256))
    return written
