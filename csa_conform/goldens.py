"""The HDF5 golden store: one file, many cases, every object covered by a digest.

The layout, the digests and what a reader refuses are specified in
specs/golden-file.md (schema_version 2). In short::

    /                                   format, schema_version, created_by, oracle_version,
                                        numpy_version, contract (generate adds suite,
                                        suite_seed, selection), manifest_sha256
    /cases/<case_id>                    attrs_json, output_names_json, family, seed,
                                        description, case_sha256
    /cases/<case_id>/kv_history         (optional) the rows current_kv windows are taken from
    /cases/<case_id>/steps/<kkkk>       expect_error on a step the oracle rejects;
                                        current_kv_rows [start, stop] on a windowed step
    /cases/<case_id>/steps/<kkkk>/inputs/<name>
    /cases/<case_id>/steps/<kkkk>/stages/<stage>/<name>
    /cases/<case_id>/steps/<kkkk>/outputs/<name>

Files are byte-reproducible: cases are written in the order given with a
fixed attribute order and no timestamps. Identical arrays are stored once
and hard-linked. Readers open every object through ``GoldenFile``, which
turns whatever HDF5 says about a damaged file into one ``GoldenFormatError``
naming the file and the object; schema_version 1 files (the layout without
digests, as other tools write it) are still read.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Mapping

import h5py
import numpy as np

from csa_conform import ORACLE_VERSION, __version__, bounded_json
from csa_conform.atomic import atomic_file
from csa_conform.contract import INPUT_NAMES
from csa_conform.contract.attributes import FLOAT_ATTRIBUTES
from csa_conform.stages import DECODED_PAYLOADS, decoded_payload
from csa_conform.errors import (
    CorruptDataset,
    CsaConformError,
    GoldenFormatError,
    GoldenIntegrityError,
    GoldenWriteError,
    MemoryShortage,
    UsageError,
)
from csa_conform.memory import address_space_left, allocate

FORMAT = "csa-conform-goldens"
SCHEMA_VERSION = 2
# schema_version 1: the same layout without case and manifest digests or windows.
READABLE_SCHEMAS = (1, SCHEMA_VERSION)
CONTRACT = "pkg.nxrt::CompressedSparseAttention v1"
# HDF5 1.10 object headers and chunk indexes: a quarter smaller than the
# 1.8-compatible default for files of many small datasets; needs HDF5 >= 1.10.
LIBVER = ("v110", "v110")
KV_HISTORY = "kv_history"
CASE_DIGEST = "case_sha256"
MANIFEST_DIGEST = "manifest_sha256"
WINDOW = "current_kv_rows"
STEP_GROUPS = ("inputs", "stages", "outputs")
# Deflate cannot expand data more than 1032-fold; a dataset claiming more is not what it says.
DEFLATE_MAX_RATIO = 1100
ALLOWED_FILTERS = {h5py.h5z.FILTER_DEFLATE, h5py.h5z.FILTER_SHUFFLE, h5py.h5z.FILTER_FLETCHER32, 32000}
COMPRESSING_FILTERS = {h5py.h5z.FILTER_DEFLATE, 32000}
MAX_TEXT_BYTES = 1 << 20
MAX_GROUP_DEPTH = 16
INT64_BOUND = 2.0**63
MAX_BATCH = 1 << 10
MAX_ROWS = 1 << 24
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
_INPUT_RANK = {name: rank for rank, name in enumerate(INPUT_NAMES)}
# What h5py raises when the bytes under it are damaged (heaps, headers, B-trees, filters).
_DAMAGE = (
    OSError, ValueError, KeyError, RuntimeError, TypeError, AttributeError, IndexError,
    OverflowError, MemoryError, RecursionError, SystemError,
)

__all__ = [
    "CONTRACT",
    "FORMAT",
    "SCHEMA_VERSION",
    "CaseInfo",
    "Compression",
    "CorruptDataset",
    "GoldenCase",
    "GoldenFile",
    "GoldenStep",
    "TensorEntry",
    "array_sha256",
    "case_digest",
    "manifest_digest",
    "write_goldens",
]


@dataclass
class GoldenStep:
    """One operator invocation: what went in, what came out, and the stage payloads."""

    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    stages: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    expect_error: str | None = None


@dataclass
class GoldenCase:
    """A named stream of steps sharing node attributes.

    ``kv_history`` (optional) is the kv row of every position; a step whose
    current_kv is a window of it is stored as the window's rows, not a copy.
    """

    case_id: str
    attrs: dict
    output_names: tuple[str, ...]
    steps: list[GoldenStep]
    family: str = ""
    seed: int | None = None
    description: str = ""
    kv_history: np.ndarray | None = None


@dataclass(frozen=True)
class CaseInfo:
    """A case's attributes without its arrays (cheap listing for inspect/verify)."""

    case_id: str
    attrs: dict
    output_names: tuple[str, ...]
    family: str
    seed: int | None
    description: str
    step_count: int
    errors: tuple[int, ...]


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a step as the file declares it, unread.

    ``sha256`` is None for a current_kv window (its rows are checked as part
    of the kv history).
    """

    path: str
    dtype: np.dtype
    shape: tuple[int, ...]
    sha256: str | None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=object)) * self.dtype.itemsize

    def record(self) -> list:
        return [self.path, self.dtype.str, list(self.shape), self.sha256]


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


def array_sha256(array: np.ndarray) -> str:
    """sha256 of the raw little-endian C-order bytes (the attribute every dataset carries)."""
    array = _little_endian(array)
    return hashlib.sha256(array.reshape(-1).view(np.uint8)).hexdigest()  # the buffer itself, not a copy


def _little_endian(array) -> np.ndarray:
    array = np.asarray(array, order="C")
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return array


# --- digests -------------------------------------------------------------------------------


def _canonical_sha256(document) -> str:
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def case_digest(
    case_id: str,
    attrs: dict,
    output_names: Iterable[str],
    family: str,
    seed: int | None,
    description: str,
    history: TensorEntry | None,
    steps: Iterable[tuple[str | None, tuple[int, int] | None, Iterable[TensorEntry]]],
) -> str:
    """The case_sha256 attribute: everything that defines a case, in canonical JSON.

    Steps are (expect_error, current_kv window rows, tensors); each tensor
    contributes its step-relative path, dtype, shape and data sha256, so a
    changed byte in a dataset, an attribute or a link all change it.
    """
    document = {
        "case": case_id,
        "attrs": attrs,
        "output_names": list(output_names),
        "family": family,
        "seed": seed,
        "description": description,
        "kv_history": None if history is None else history.record(),
        "steps": [
            {
                "expect_error": expect_error,
                "current_kv_rows": None if window is None else list(window),
                "tensors": sorted(entry.record() for entry in tensors),
            }
            for expect_error, window, tensors in steps
        ],
    }
    return _canonical_sha256(document)


def manifest_digest(root_attrs: Mapping[str, str | int | float], cases: Mapping[str, str]) -> str:
    """The manifest_sha256 root attribute: root provenance plus every case's case_sha256."""
    root = {key: value for key, value in root_attrs.items() if key != MANIFEST_DIGEST}
    return _canonical_sha256({"root": root, "cases": dict(cases)})


# --- writing -----------------------------------------------------------------------------


def write_goldens(
    path: str | os.PathLike,
    cases: Iterable[GoldenCase],
    *,
    force: bool = False,
    compression: Compression = Compression(),
    provenance: Mapping[str, str | int] | None = None,
) -> int:
    """Write ``cases`` (consumed lazily, in the order given) and return how many were written.

    The file appears under ``path`` only once complete; anything that stops
    the write (an error, a full disk, Ctrl-C, SIGTERM) leaves no file and no
    temporary behind, and without ``force`` an existing file is never replaced.
    """
    path = Path(path)
    if path.exists() and not force:
        raise UsageError(f"{path} exists; pass --force to overwrite it")
    digests: dict[str, str] = {}
    with atomic_file(path, replace=force) as handle:
        image = _file_image(cases, compression, provenance or {}, digests)
        with _write_errors(path):
            handle.write(image)
    return len(digests)


def _file_image(
    cases: Iterable[GoldenCase], compression: Compression, provenance: Mapping[str, str | int], digests: dict
) -> bytes:
    """The whole file, built in memory; fills ``digests`` (case id -> case_sha256).

    HDF5 is never the one writing to disk: after a failed write (a full disk)
    its close and shutdown crash the process, while a failed plain write of
    these bytes is an ordinary OSError. Costs the file's size in memory twice.
    """
    stored: dict[tuple, h5py.Dataset] = {}
    with h5py.File(f"golden-{os.getpid()}.h5", "w", driver="core", backing_store=False, libver=LIBVER) as handle:
        _write_root(handle, provenance)
        root = handle.create_group("cases")
        for case in cases:
            if case.case_id in digests:
                raise GoldenFormatError(f"case id {case.case_id!r} appears twice")
            digests[case.case_id] = _write_case(root, case, compression, stored)
        root_attrs = {key: _attr_value(value) for key, value in handle.attrs.items()}
        handle.attrs[MANIFEST_DIGEST] = manifest_digest(root_attrs, digests)
        handle.flush()
        return handle.id.get_file_image()


@contextmanager
def _write_errors(path: Path) -> Iterator[None]:
    """A full disk or a file size limit is one GoldenWriteError, not a traceback."""
    try:
        yield
    except (OSError, RuntimeError) as error:
        raise GoldenWriteError(f"{path}: cannot write ({_first_line(error)}); nothing written") from None


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


def _write_case(root: h5py.Group, case: GoldenCase, compression: Compression, stored: dict) -> str:
    """Write one case; returns its case_sha256."""
    _check_case_id(case.case_id)
    group = root.create_group(case.case_id)
    history = None
    if case.kv_history is not None:
        history = _write_arrays(group, {KV_HISTORY: case.kv_history}, "", compression, stored)[0]
    steps = group.create_group("steps")
    described = []
    for index, step in enumerate(case.steps):
        node = steps.create_group(f"{index:04d}")
        if step.expect_error is not None:
            node.attrs["expect_error"] = step.expect_error
        window = _history_window(step.inputs, case.kv_history)
        if window is not None:
            node.attrs[WINDOW] = np.array(window, dtype=np.int64)
        # Not creation-ordered: readers list inputs in positional order anyway, and order
        # tracking makes a group of ~20 links 0.7 KB larger.
        inputs = {name: array for name, array in step.inputs.items() if not (window and name == "current_kv")}
        tensors = _write_arrays(node.create_group("inputs"), inputs, "inputs/", compression, stored)
        if step.stages:
            stages = node.create_group("stages", track_order=True)
            for stage, payload in step.stages.items():
                group_of_stage = stages.create_group(stage, track_order=True)
                tensors += _write_arrays(group_of_stage, payload, f"stages/{stage}/", compression, stored)
        if step.expect_error is None:
            outputs = node.create_group("outputs", track_order=True)
            tensors += _write_arrays(outputs, step.outputs, "outputs/", compression, stored)
        described.append((step.expect_error, window, tensors))
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


def _history_window(inputs: Mapping[str, np.ndarray], history: np.ndarray | None) -> tuple[int, int] | None:
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


def _write_arrays(
    group, arrays: Mapping[str, np.ndarray], prefix: str, compression: Compression, stored: dict
) -> list[TensorEntry]:
    written = []
    for name, array in arrays.items():
        array = _little_endian(array)
        digest = array_sha256(array)
        key = (digest, array.dtype.str, array.shape)
        if key in stored:
            group[name] = stored[key]
        else:
            dataset = group.create_dataset(name, data=array, **compression.options(array))
            dataset.attrs["sha256"] = digest
            stored[key] = dataset
        written.append(TensorEntry(prefix + name, array.dtype, array.shape, digest))
    return written


# --- reading -----------------------------------------------------------------------------


@dataclass
class _StepIndex:
    name: str
    expect_error: str | None
    window: tuple[int, int] | None
    # step-relative path -> (entry, dataset or None for the current_kv window)
    tensors: dict[str, tuple[TensorEntry, h5py.Dataset | None]]
    stages: tuple[str, ...]


@dataclass
class _CaseIndex:
    info: CaseInfo
    history: tuple[TensorEntry, h5py.Dataset] | None
    steps: list[_StepIndex]
    history_rows: np.ndarray | None = None


class GoldenFile:
    """A golden file opened for reading; every array read is checked against its sha256.

    Opening checks the root and (schema 2) the manifest digest; the first
    access to a case checks its layout, its case digest and the declared size
    of every tensor against the case's geometry, before any data is read.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        _require_regular_file(self.path)
        _refuse_appended_bytes(self.path)
        try:
            self._handle = h5py.File(self.path, "r")
        except _DAMAGE as error:
            raise GoldenFormatError(f"{self.path}: not an HDF5 file ({_first_line(error)})") from None
        self._cases: dict[str, _CaseIndex] = {}
        # The last case whose checksums were verified: its arrays by HDF5 object, read-only, so
        # replaying it reads and hashes each object once however many steps link it.
        self._verified: dict[int, np.ndarray] = {}
        try:
            self._traverse()
            with self._guard("/"):
                self.schema_version = self._check_root()
                self._case_ids, self.manifest = self._check_manifest()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> GoldenFile:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        try:
            self._handle.close()
        except _DAMAGE:
            pass

    @contextmanager
    def _guard(self, where: str) -> Iterator[None]:
        try:
            yield
        except CsaConformError:
            raise
        except _DAMAGE as error:
            _refuse_memory_shortage(error, f"{self.path}: {where}")
            problem = f"{type(error).__name__}: {_first_line(error)}"
            raise GoldenFormatError(f"{self.path}: {where}: damaged or unreadable ({problem})") from None

    def _traverse(self) -> None:
        """Visit every object once, so damage in headers no command reads is still reported.

        Iterative and bounded in depth (MAX_GROUP_DEPTH): HDF5's own visit builds every object's
        full path, which for a chain of 20,000 nested groups never ends.
        """
        visited = ["/"]
        pending = [(self._handle.id, "", 0)]
        try:
            seen = {h5py.h5o.get_info(self._handle.id).addr}
            while pending:
                group, where, depth = pending.pop()
                for raw in group.__iter__():
                    if group.links.get_info(raw).type != h5py.h5l.TYPE_HARD:
                        continue
                    child = h5py.h5o.open(group, raw)
                    address = h5py.h5o.get_info(child).addr
                    if address in seen:
                        continue
                    seen.add(address)
                    path = f"{where}/{raw.decode('utf-8', 'replace')}"
                    visited.append(path)
                    if isinstance(child, h5py.h5g.GroupID):
                        if depth + 1 > MAX_GROUP_DEPTH:
                            raise GoldenFormatError(
                                f"{self.path}: groups nested deeper than {MAX_GROUP_DEPTH} levels under "
                                f"{path[:120]}… (the golden layout has 6)"
                            )
                        pending.append((child, path, depth + 1))
        except _DAMAGE as error:
            _refuse_memory_shortage(error, f"{self.path}: /{visited[-1].lstrip('/')}")
            problem = f"{type(error).__name__}: {_first_line(error)}"
            raise GoldenFormatError(
                f"{self.path}: damaged object after /{visited[-1].lstrip('/')} ({problem})"
            ) from None

    # --- root and manifest

    def _check_root(self) -> int:
        attrs = self._handle.attrs
        if _plain_text(attrs.get("format")) != FORMAT:
            raise GoldenFormatError(
                f"{self.path}: not a csa-conform golden file (root attribute format != {FORMAT!r})"
            )
        version = attrs.get("schema_version")
        integer = isinstance(version, (int, np.integer)) and not isinstance(version, (bool, np.bool_))
        if not integer or int(version) not in READABLE_SCHEMAS:
            shown = repr(_attr_value(version)) if not integer else str(int(version))
            raise GoldenFormatError(
                f"{self.path}: schema_version {shown} is not supported; this csa-conform reads "
                f"schema_version {SCHEMA_VERSION} (and 1, the layout without digests); "
                "use a matching csa-conform or regenerate the file"
            )
        version = int(version)
        if version == 1 and MANIFEST_DIGEST in attrs:
            raise GoldenIntegrityError(
                self.path, "/", f"schema_version 1 but a {MANIFEST_DIGEST} attribute: schema_version was altered"
            )
        self._require_group(self._handle, "cases")
        return version

    def _root_attrs(self) -> dict:
        values = {}
        for key in self._handle.attrs:
            value = _attr_value(self._handle.attrs[key])
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise GoldenFormatError(f"{self.path}: root attribute {key!r} is not text or a number")
            values[key] = value
        return values

    def _check_manifest(self) -> tuple[list[str], str]:
        root = self._root_attrs()
        cases = self._require_group(self._handle, "cases")
        case_ids = sorted(self._member_names(cases))
        if self.schema_version == 1:
            return case_ids, manifest_digest(root, {case_id: "" for case_id in case_ids})
        stored = self._digest_attr(self._handle, MANIFEST_DIGEST, "/")
        digests = {}
        for case_id in case_ids:
            group = self._member(cases, case_id, h5py.Group, checked=True)
            digests[case_id] = self._digest_attr(group, CASE_DIGEST, group.name)
        computed = manifest_digest(root, digests)
        if computed != stored:
            raise GoldenIntegrityError(
                self.path, "/",
                f"{MANIFEST_DIGEST} mismatch (stored {stored}, computed {computed}): "
                "the root attributes or the list of cases changed",
            )
        return case_ids, stored

    def _digest_attr(self, obj, name: str, where: str) -> str:
        value = self._text_attr(obj, name, where)
        if value is None or not _HEX_DIGEST.fullmatch(value):
            raise GoldenFormatError(f"{self.path}: {where}: attribute {name} is not a sha256 hex digest")
        return value

    # --- structure helpers

    def _member_names(self, group: h5py.Group) -> list[str]:
        names = list(group)
        for name in names:
            self._hard_link(group, name)
        return names

    def _hard_link(self, group: h5py.Group, name: str) -> None:
        link = group.get(name, getlink=True)
        if link is None:
            raise GoldenFormatError(f"{self.path}: {group.name} has no member {name!r}")
        if not isinstance(link, h5py.HardLink):
            kind = "an external link" if isinstance(link, h5py.ExternalLink) else "a soft link"
            raise GoldenFormatError(
                f"{self.path}: {group.name.rstrip('/')}/{name} is {kind}; golden files hold hard links only"
            )

    def _member(self, group: h5py.Group, name: str, kind, checked: bool = False):
        if not checked:
            self._hard_link(group, name)
        item = group[name]
        if not isinstance(item, kind):
            noun = "group" if kind is h5py.Group else "dataset"
            raise GoldenFormatError(f"{self.path}: {item.name} should be a {noun}")
        return item

    def _require_group(self, group, name: str) -> h5py.Group:
        if name not in self._member_names(group):
            raise GoldenFormatError(f"{self.path}: missing group {group.name.rstrip('/')}/{name}")
        return self._member(group, name, h5py.Group)

    def _text_attr(self, obj, name: str, where: str) -> str | None:
        if name not in obj.attrs:
            return None
        value = obj.attrs[name]
        if isinstance(value, np.ndarray) and value.shape == ():
            value = value[()]
        if isinstance(value, str):
            value = value.encode("utf-8", errors="surrogatepass")
        if not isinstance(value, bytes):
            raise GoldenFormatError(f"{self.path}: {where}: attribute {name} is not text")
        # The limit is on the stored UTF-8 bytes (a character can take four).
        if len(value) > MAX_TEXT_BYTES:
            raise GoldenFormatError(f"{self.path}: {where}: attribute {name} is longer than {MAX_TEXT_BYTES} bytes")
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise GoldenFormatError(f"{self.path}: {where}: attribute {name} is not UTF-8 text") from None

    def _json_attr(self, obj, name: str, where: str, non_finite: bool = False):
        text = self._text_attr(obj, name, where)
        if text is None:
            raise GoldenFormatError(f"{self.path}: {where} lacks attribute {name}")
        try:
            return bounded_json.parse(text, non_finite=non_finite)
        except ValueError as error:
            problem = _first_line(error)
            raise GoldenFormatError(f"{self.path}: {where}: attribute {name} is not JSON a golden file may hold "
                                    f"({problem})") from None

    # --- cases

    def case_ids(self) -> list[str]:
        return list(self._case_ids)

    def _case(self, case_id: str) -> _CaseIndex:
        if case_id not in self._cases:
            if case_id not in self._case_ids:
                raise GoldenFormatError(f"{self.path}: no case {case_id!r}")
            where = f"/cases/{case_id}"
            with self._guard(where):
                self._cases[case_id] = self._index_case(case_id, where)
        return self._cases[case_id]

    def _index_case(self, case_id: str, where: str) -> _CaseIndex:
        group = self._member(self._handle["cases"], case_id, h5py.Group)
        attrs = self._json_attr(group, "attrs_json", where, non_finite=True)
        if not isinstance(attrs, dict) or not all(
            isinstance(value, (int, float, str)) for value in attrs.values()
        ):
            raise GoldenFormatError(f"{self.path}: {where}: attrs_json must be an object of numbers and strings")
        for key, value in attrs.items():
            # Every node attribute but the float ones is an int64: 1e30 there is no integer it could read as.
            if isinstance(value, float) and key not in FLOAT_ATTRIBUTES and not abs(value) < INT64_BOUND:
                raise GoldenFormatError(f"{self.path}: {where}: attrs_json: attribute {key} = {value!r} "
                                        "is outside int64")
        output_names = self._json_attr(group, "output_names_json", where)
        if not isinstance(output_names, list) or not all(isinstance(name, str) for name in output_names):
            raise GoldenFormatError(f"{self.path}: {where}: output_names_json must be a list of strings")
        family = self._text_attr(group, "family", where) or ""
        description = self._text_attr(group, "description", where) or ""
        seed = group.attrs.get("seed")
        if seed is not None:
            if not isinstance(seed, np.integer) or isinstance(seed, np.bool_):
                raise GoldenFormatError(f"{self.path}: {where}: attribute seed is not an integer")
            seed = int(seed)
        members = set(self._member_names(group)) - {"steps", KV_HISTORY}
        if members:
            raise GoldenFormatError(f"{self.path}: {where}: unexpected member {sorted(members)[0]!r}")
        history = None
        if KV_HISTORY in group:
            dataset = self._member(group, KV_HISTORY, h5py.Dataset)
            history = (self._entry(dataset, KV_HISTORY), dataset)
        steps = [self._index_step(node, history) for node in self._step_groups(group, case_id)]
        if self.schema_version >= 2:
            stored = self._digest_attr(group, CASE_DIGEST, where)
            computed = case_digest(
                case_id, attrs, output_names, family, seed, description,
                None if history is None else history[0],
                [(step.expect_error, step.window, [entry for entry, dataset in step.tensors.values()
                                                   if dataset is not None]) for step in steps],
            )
            if computed != stored:
                raise GoldenIntegrityError(
                    self.path, f"case {where}",
                    f"{CASE_DIGEST} mismatch (stored {stored}, computed {computed}): "
                    "its attributes, tensor list, shapes, dtypes or checksums changed",
                )
        index = _CaseIndex(
            CaseInfo(
                case_id=case_id,
                attrs=attrs,
                output_names=tuple(output_names),
                family=family,
                seed=seed,
                description=description,
                step_count=len(steps),
                errors=tuple(i for i, step in enumerate(steps) if step.expect_error is not None),
            ),
            history,
            steps,
        )
        self._check_geometry(index, where)
        return index

    def _step_groups(self, group: h5py.Group, case_id: str) -> list[h5py.Group]:
        steps = self._require_group(group, "steps")
        names = sorted(self._member_names(steps))
        if not names:
            raise GoldenFormatError(f"{self.path}: case {case_id!r} has no steps")
        if names != [f"{index:04d}" for index in range(len(names))]:
            raise GoldenFormatError(
                f"{self.path}: case {case_id!r} steps must be named 0000, 0001, ...; got {names[:4]}"
            )
        return [self._member(steps, name, h5py.Group, checked=True) for name in names]

    def _index_step(self, node: h5py.Group, history) -> _StepIndex:
        where = node.name
        expect_error = self._text_attr(node, "expect_error", where)
        members = self._member_names(node)
        unexpected = set(members) - set(STEP_GROUPS)
        if unexpected:
            raise GoldenFormatError(f"{self.path}: {where}: unexpected member {sorted(unexpected)[0]!r}")
        if "inputs" not in members:
            raise GoldenFormatError(f"{self.path}: {where} has no inputs group")
        if expect_error is None and "outputs" not in members:
            raise GoldenFormatError(f"{self.path}: {where} has neither outputs nor expect_error")
        inputs = self._datasets(self._member(node, "inputs", h5py.Group), "inputs/")
        window = self._window(node, history, inputs)
        inputs = dict(sorted(inputs.items(), key=_input_rank))
        tensors = dict(inputs)
        stages = ()
        if "stages" in members:
            stage_groups = self._member(node, "stages", h5py.Group)
            stages = tuple(self._member_names(stage_groups))
            for stage in stages:
                tensors.update(self._datasets(self._member(stage_groups, stage, h5py.Group), f"stages/{stage}/"))
        if "outputs" in members:
            tensors.update(self._datasets(self._member(node, "outputs", h5py.Group), "outputs/"))
        return _StepIndex(node.name.rsplit("/", 1)[1], expect_error, window, tensors, stages)

    def _window(self, node: h5py.Group, history, inputs: dict) -> tuple[int, int] | None:
        if WINDOW not in node.attrs:
            return None
        where = node.name
        rows = node.attrs[WINDOW]
        if self.schema_version < 2 or history is None or "inputs/current_kv" in inputs:
            raise GoldenFormatError(
                f"{self.path}: {where}: {WINDOW} needs schema_version 2, a kv_history and no inputs/current_kv"
            )
        if not isinstance(rows, np.ndarray) or rows.shape != (2,) or rows.dtype.kind not in "iu":
            raise GoldenFormatError(f"{self.path}: {where}: {WINDOW} must be two integers")
        start, stop = int(rows[0]), int(rows[1])
        entry = history[0]
        if entry.ndim != 3 or not 0 <= start < stop <= entry.shape[1]:
            raise GoldenFormatError(
                f"{self.path}: {where}: {WINDOW} [{start}, {stop}] is not a window of kv_history {entry.shape}"
            )
        shape = (entry.shape[0], stop - start, entry.shape[2])
        inputs["inputs/current_kv"] = (TensorEntry("inputs/current_kv", entry.dtype, shape, None), None)
        return (start, stop)

    def _datasets(self, group: h5py.Group, prefix: str) -> dict[str, tuple[TensorEntry, h5py.Dataset]]:
        found = {}
        for name in self._member_names(group):
            dataset = self._member(group, name, h5py.Dataset, checked=True)
            found[prefix + name] = (self._entry(dataset, prefix + name), dataset)
        return found

    def _entry(self, dataset: h5py.Dataset, path: str) -> TensorEntry:
        """A dataset's declared dtype, shape and checksum, refused if reading it could be unbounded."""
        where = dataset.name
        plist = dataset.id.get_create_plist()
        layout = plist.get_layout()
        if layout == h5py.h5d.VIRTUAL:
            raise GoldenFormatError(f"{self.path}: {where} is a virtual dataset; golden files hold data only")
        if layout not in (h5py.h5d.COMPACT, h5py.h5d.CONTIGUOUS, h5py.h5d.CHUNKED) or plist.get_external_count():
            raise GoldenFormatError(f"{self.path}: {where} stores its data outside the file")
        dtype = dataset.dtype
        if dtype.kind not in "biuf" or dtype.itemsize > 8 or h5py.check_dtype(vlen=dtype) is not None:
            raise GoldenFormatError(f"{self.path}: {where} has dtype {dtype}; golden tensors are numbers")
        shape = dataset.shape
        if shape is None:
            raise GoldenFormatError(f"{self.path}: {where} has no shape")
        entry = TensorEntry(path, dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype, shape, None)
        filters = {plist.get_filter(index)[0] for index in range(plist.get_nfilters())}
        if not filters <= ALLOWED_FILTERS:
            raise GoldenFormatError(f"{self.path}: {where} uses filters {sorted(filters)}; gzip, shuffle, lzf only")
        if layout == h5py.h5d.CHUNKED:
            chunk = plist.get_chunk()
            if len(chunk) != len(shape) or any(c > max(s, 1) for c, s in zip(chunk, shape)):
                raise GoldenFormatError(f"{self.path}: {where} declares chunks {chunk} larger than its shape {shape}")
        stored = dataset.id.get_storage_size()
        expansion = DEFLATE_MAX_RATIO if filters & COMPRESSING_FILTERS else 1
        if entry.nbytes > stored * expansion:
            raise GoldenFormatError(
                f"{self.path}: {where} declares {entry.nbytes} bytes but stores {stored}; it was never written"
            )
        digest = self._text_attr(dataset, "sha256", where)
        if digest is None:
            raise GoldenFormatError(f"{self.path}: dataset {where} has no sha256 attribute (specs/golden-file.md)")
        if not _HEX_DIGEST.fullmatch(digest):
            raise GoldenFormatError(f"{self.path}: {where}: attribute sha256 is not a sha256 hex digest")
        return TensorEntry(path, entry.dtype, shape, digest)

    def _check_geometry(self, index: _CaseIndex, where: str) -> None:
        """Refuse tensors larger than the case's geometry can make, before reading any.

        A step's tensors are bounded by batch B (seqlens_k's length), the rows
        T the stream has reached (total_sequence_length), the heads of the
        node attributes and the widest row the contract has (2 x 512 floats).
        """
        attrs = index.info.attrs
        heads = max(_positive(attrs.get("num_heads")), _positive(attrs.get("index_num_heads")))
        largest_rows = 0
        for step in index.steps:
            batch, rows = 1, 0
            seqlens = step.tensors.get("inputs/seqlens_k")
            if seqlens is not None and seqlens[0].ndim == 1:
                batch = min(max(seqlens[0].shape[0], 1), MAX_BATCH)
            total = step.tensors.get("inputs/total_sequence_length")
            if total is not None and total[0].shape == () and total[0].dtype.kind in "iu":
                rows = min(max(int(self._read(*total)), 0), MAX_ROWS)
            largest_rows = max(largest_rows, rows)
            limit = _tensor_limit(batch, rows, heads)
            for entry, dataset in step.tensors.values():
                if entry.nbytes > limit:
                    raise GoldenFormatError(
                        f"{self.path}: {where}/steps/{step.name}/{entry.path} declares shape {entry.shape} "
                        f"({entry.nbytes} bytes), more than the case's geometry allows ({limit} bytes)"
                    )
        if index.history is not None:
            entry = index.history[0]
            limit = _tensor_limit(MAX_BATCH, largest_rows, 1)
            if entry.nbytes > limit:
                raise GoldenFormatError(
                    f"{self.path}: {where}/{KV_HISTORY} declares shape {entry.shape}, more than the "
                    f"case's geometry allows ({limit} bytes)"
                )

    def case_info(self, case_id: str) -> CaseInfo:
        return self._case(case_id).info

    def step_count(self, case_id: str) -> int:
        return self._case(case_id).info.step_count

    def _step(self, case_id: str, index: int) -> _StepIndex:
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
        with self._guard("/"):
            return self._root_attrs()

    def read_step(self, case_id: str, index: int) -> GoldenStep:
        step = self._step(case_id, index)
        read = GoldenStep(inputs={}, expect_error=step.expect_error)
        for path, (entry, dataset) in step.tensors.items():
            array = self._read_window(case_id, step) if dataset is None else self._read_verified(entry, dataset)
            group, _, name = path.rpartition("/")
            if group == "inputs":
                read.inputs[name] = array
            elif group == "outputs":
                read.outputs[name] = array
            else:
                read.stages.setdefault(group.split("/", 1)[1], {})[name] = array
        for (stage, tensor), cache in DECODED_PAYLOADS.items():
            payload = read.stages.get(stage, {})
            if tensor not in payload and cache in payload:
                payload[tensor] = decoded_payload(stage, payload[cache])
        return read

    def _read_window(self, case_id: str, step: _StepIndex) -> np.ndarray:
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
        case = self._case(case_id)
        pairs = [pair for step in case.steps for pair in step.tensors.values() if pair[1] is not None]
        if case.history is not None:
            pairs.append(case.history)
        sizes = {}
        for entry, dataset in pairs:
            with self._guard(dataset.name):
                sizes[h5py.h5o.get_info(dataset.id).addr] = entry.nbytes
        return sum(sizes.values())

    def verify_case_checksums(self, case_id: str) -> int:
        """Check every dataset of a case once (kv history and hard links included); returns the count."""
        case = self._case(case_id)
        datasets: dict[int, list] = {}
        pairs = [pair for step in case.steps for pair in step.tensors.values() if pair[1] is not None]
        if case.history is not None:
            pairs.append(case.history)
        for entry, dataset in pairs:
            with self._guard(dataset.name):
                datasets.setdefault(h5py.h5o.get_info(dataset.id).addr, []).append((entry, dataset))
        self._verified = {}
        for address, links in datasets.items():
            try:
                array = self._read(*links[0])
            except CorruptDataset as corrupt:
                names = tuple(sorted({dataset.name for _, dataset in links}))
                also = [name for name in names if name != corrupt.dataset]
                reason = f"{corrupt.reason}; the same dataset is also {', '.join(also)}" if also else corrupt.reason
                raise CorruptDataset(self.path, corrupt.dataset, reason, names) from None
            array.flags.writeable = False
            self._verified[address] = array
        return len(datasets)

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
        return self._read_window(case_id, step) if dataset is None else self._read(entry, dataset)

    def _read_verified(self, entry: TensorEntry, dataset: h5py.Dataset) -> np.ndarray:
        """The array verify_case_checksums already read and checked, else read and check it now."""
        with self._guard(dataset.name):
            address = h5py.h5o.get_info(dataset.id).addr
        verified = self._verified.get(address)
        return verified if verified is not None else self._read(entry, dataset)

    def _read(self, entry: TensorEntry, dataset: h5py.Dataset) -> np.ndarray:
        where = dataset.name
        # Sized up front, in native byte order: HDF5 converts a big-endian dataset while reading, and
        # a memory limit shows as what it is before any byte is read.
        array = allocate(entry.shape, entry.dtype, f"{self.path}: {where}")
        try:
            if array.size:
                dataset.read_direct(array)
        except _DAMAGE as error:
            raise CorruptDataset(self.path, where, f"unreadable ({_first_line(error)})") from None
        if array.shape != entry.shape:
            raise CorruptDataset(self.path, where, f"read shape {array.shape}, declared {entry.shape}")
        actual = array_sha256(array)
        if actual != entry.sha256:
            raise CorruptDataset(self.path, where, f"sha256 mismatch (stored {entry.sha256}, data {actual})")
        return array


def _refuse_memory_shortage(error: BaseException, where: str) -> None:
    """Under an address-space limit a MemoryError from HDF5 is the limit (exit 4); without one, a header
    that asks for absurd memory is damage (the caller's GoldenFormatError)."""
    bound = address_space_left()
    if isinstance(error, MemoryError) and bound is not None:
        raise MemoryShortage(f"{where}: out of memory reading the file's metadata under the {bound[1]}") from None


def _require_regular_file(path: str) -> None:
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise GoldenFormatError(f"{path}: no such file") from None
    except OSError as error:
        raise GoldenFormatError(f"{path}: cannot open ({error.strerror})") from None
    if not stat.S_ISREG(mode):
        raise GoldenFormatError(f"{path}: not a regular file (a golden file is a plain HDF5 file)")


_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _hdf5_end(path: str) -> int | None:
    """Where the HDF5 data of a file ends: its superblock's base address plus end-of-file address.

    The superblock sits at byte 0, 512, 1024, 2048, ... (after a user block); versions 0 and 1
    keep the end-of-file address after two addresses from byte 24 (28), versions 2 and 3 from 12.
    """
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        offset = 0
        while offset < min(size, 1 << 40):
            handle.seek(offset)
            head = handle.read(64)
            if head[:8] == _SIGNATURE and len(head) >= 16:
                version = head[8]
                width = head[13] if version in (0, 1) else head[9]
                start = {0: 24, 1: 28, 2: 12, 3: 12}.get(version)
                if start is None or width not in (2, 4, 8) or len(head) < start + 3 * width:
                    return None

                def address(index: int) -> int:
                    return int.from_bytes(head[start + index * width:start + (index + 1) * width], "little")

                return address(0) + address(2)
            offset = 512 if offset == 0 else offset * 2
    return None


def _refuse_appended_bytes(path: str) -> None:
    """A file longer than its HDF5 data (bytes or a sparse hole appended) is not the file that was written.

    Reading it would still work, but hashing it for the results document would read every appended byte.
    """
    end = _hdf5_end(path)
    size = os.path.getsize(path)
    if end is not None and size > end:
        raise GoldenFormatError(f"{path}: {size - end} bytes follow the end of its HDF5 data (at byte {end}); "
                                "a golden file holds nothing after its data")


def _tensor_limit(batch: int, rows: int, heads: int) -> int:
    """Bytes a tensor of a step can need: B x H x R x (R + 2048) x 8 with R = T + 1024 rows, plus carries."""
    rows += 1024
    return 8 * batch * heads * rows * (rows + 2048) + (4 << 20) * batch


def _positive(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_BATCH else 1


def _input_rank(member: tuple[str, object]) -> int:
    return _INPUT_RANK.get(member[0].rsplit("/", 1)[1], len(_INPUT_RANK))


def _plain_text(value) -> str | None:
    if isinstance(value, np.ndarray) and value.shape == ():
        value = value[()]
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value if isinstance(value, str) else None


def _attr_value(value):
    text = _plain_text(value)
    if text is not None:
        return text
    if isinstance(value, np.generic):
        return value.item()
    return value


def _first_line(error: BaseException) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__
