"""The HDF5 golden store of specs/golden-file.md: one file, many cases, every dataset checksummed.

Layout (schema_version 1)::

    /                                   format, schema_version, created_by, oracle_version,
                                        numpy_version, contract (generate adds suite,
                                        suite_seed, selection)
    /cases/<case_id>                    attrs_json, output_names_json, family, seed, description
    /cases/<case_id>/kv_history         (optional) the rows current_kv windows are views of
    /cases/<case_id>/steps/<kkkk>/inputs/<name>
    /cases/<case_id>/steps/<kkkk>/stages/<stage>/<name>
    /cases/<case_id>/steps/<kkkk>/outputs/<name>
    /cases/<case_id>/steps/<kkkk>       expect_error (full message) on a step the oracle rejects

Files are byte-reproducible: cases are written in the order given (generate
sorts them by id) with a fixed attribute order and no timestamps, so the
same cases give the same bytes. Identical arrays (a step's ``past_*``
and the previous ``present_*``, the writeback stage and the outputs, the
weights every case of a model shares) are stored once and hard-linked, and
each ``current_kv`` window is a virtual dataset over the case's kv history;
readers cannot tell either from a copy. Files written by other tools only
need the layout: stages, ``family``, ``seed`` and ``description`` are
optional there.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Mapping

import h5py
import numpy as np

from csa_conform import ORACLE_VERSION, __version__
from csa_conform.contract import INPUT_NAMES
from csa_conform.errors import CorruptDataset, GoldenFormatError, UsageError

FORMAT = "csa-conform-goldens"
SCHEMA_VERSION = 1
CONTRACT = "pkg.nxrt::CompressedSparseAttention v1"
# HDF5 1.10 object headers and chunk indexes: a quarter smaller than the
# 1.8-compatible default for files of many small datasets; needs HDF5 >= 1.10.
LIBVER = ("v110", "v110")
KV_HISTORY = "kv_history"
_INPUT_RANK = {name: rank for rank, name in enumerate(INPUT_NAMES)}

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
    "array_sha256",
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
    current_kv is a window of it is stored as a view of it, not a copy.
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
class Compression:
    """h5py filter settings for datasets of at least ``min_bytes``.

    Measured on the ci suite: gzip level 4 with byte shuffle (which groups
    the zero low bytes of bf16-valued floats) stores its arrays in an eighth
    of their raw size. One chunk per dataset (up to ``max_chunk_bytes``)
    makes the file 15% smaller than h5py's default chunks: gzip sees the
    whole array and the chunk index is a single address. gzip 1 is 3% and
    lzf 23% larger; gzip 9 gains 2% but writes full-precision arrays 2.5
    times slower. Datasets under 256 bytes stay contiguous, as a hex editor
    shows them.
    """

    codec: str | None = "gzip"
    level: int | None = 4
    shuffle: bool = True
    min_bytes: int = 256
    max_chunk_bytes: int = 8 << 20

    def options(self, array: np.ndarray) -> dict:
        if self.codec is None or array.ndim == 0 or array.size == 0 or array.nbytes < self.min_bytes:
            return {}
        chunks = array.shape if array.nbytes <= self.max_chunk_bytes else True
        options = {"compression": self.codec, "shuffle": self.shuffle, "chunks": chunks}
        if self.codec == "gzip":
            options["compression_opts"] = self.level
        return options


def array_sha256(array: np.ndarray) -> str:
    """sha256 of the raw little-endian C-order bytes (the attribute every dataset carries)."""
    array = _little_endian(array)
    return hashlib.sha256(array.tobytes()).hexdigest()


def _little_endian(array) -> np.ndarray:
    array = np.asarray(array, order="C")
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return array


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
    the write (an error, Ctrl-C) leaves no file and no temporary behind.
    """
    path = Path(path)
    if path.exists() and not force:
        raise UsageError(f"{path} exists; pass --force to overwrite it")
    seen: set[str] = set()
    stored: dict[tuple, h5py.Dataset] = {}
    with _atomic_file(path) as temporary:
        with h5py.File(temporary, "w", libver=LIBVER) as handle:
            _write_root(handle, provenance or {})
            root = handle.create_group("cases")
            for case in cases:
                if case.case_id in seen:
                    raise GoldenFormatError(f"case id {case.case_id!r} appears twice")
                seen.add(case.case_id)
                _write_case(root, case, compression, stored)
    return len(seen)


@contextmanager
def _atomic_file(path: Path) -> Iterator[Path]:
    descriptor, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(descriptor)
    temporary = Path(name)
    try:
        yield temporary
        umask = os.umask(0)
        os.umask(umask)
        # mkstemp makes the file private (0600); give it the mode a plain open() would.
        os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


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
    if not case_id or "/" in case_id or case_id in (".", ".."):
        raise GoldenFormatError(f"case id {case_id!r} cannot name an HDF5 group")


def _write_case(root: h5py.Group, case: GoldenCase, compression: Compression, stored: dict) -> None:
    _check_case_id(case.case_id)
    group = root.create_group(case.case_id)
    group.attrs["attrs_json"] = json.dumps(case.attrs, sort_keys=True)
    group.attrs["output_names_json"] = json.dumps(list(case.output_names))
    group.attrs["family"] = case.family
    if case.seed is not None:
        group.attrs["seed"] = np.int64(case.seed)
    group.attrs["description"] = case.description
    history = None
    if case.kv_history is not None:
        history = _write_arrays(group, {KV_HISTORY: case.kv_history}, compression, stored)[KV_HISTORY]
    steps = group.create_group("steps")
    for index, step in enumerate(case.steps):
        node = steps.create_group(f"{index:04d}")
        if step.expect_error is not None:
            node.attrs["expect_error"] = step.expect_error
        # Not creation-ordered: readers list inputs in positional order anyway, and order
        # tracking makes a group of ~20 links 0.7 KB larger.
        inputs = node.create_group("inputs")
        window = _history_window(step.inputs, case.kv_history)
        for name, array in step.inputs.items():
            if name == "current_kv" and window is not None:
                _write_window(inputs, name, array, history, window, stored)
            else:
                _write_arrays(inputs, {name: array}, compression, stored)
        if step.stages:
            stages = node.create_group("stages", track_order=True)
            for stage, payload in step.stages.items():
                _write_arrays(stages.create_group(stage, track_order=True), payload, compression, stored)
        if step.expect_error is None:
            _write_arrays(node.create_group("outputs", track_order=True), step.outputs, compression, stored)


def _history_window(inputs: Mapping[str, np.ndarray], history: np.ndarray | None) -> slice | None:
    """The rows of the case's kv history that this step's current_kv is, if it is one."""
    current = inputs.get("current_kv")
    total = inputs.get("total_sequence_length")
    if history is None or current is None or total is None or np.ndim(total) != 0:
        return None
    total = int(total)
    rows = slice(total - current.shape[1], total) if current.ndim == 3 else None
    if rows is None or rows.start < 0 or rows.start == rows.stop or total > history.shape[1]:
        return None
    window = history[:, rows]
    if window.dtype != current.dtype or window.shape != current.shape or not np.array_equal(
        window.view(np.uint8), np.ascontiguousarray(current).view(np.uint8)
    ):
        return None
    return rows


def _write_window(group, name: str, array: np.ndarray, history: h5py.Dataset, rows: slice, stored) -> None:
    """current_kv as a virtual dataset over the case's kv history (no copy of the rows).

    Built with the low-level API because h5py's VirtualLayout cannot turn off
    object timestamps, which would make the file differ run to run. The
    source file is ".", the file itself, so renaming the file keeps it valid.
    """
    array = _little_endian(array)
    digest = array_sha256(array)
    key = (digest, array.dtype.str, array.shape)
    if key in stored:
        group[name] = stored[key]
        return
    virtual = h5py.h5s.create_simple(array.shape)
    source = h5py.h5s.create_simple(history.shape)
    source.select_hyperslab((0, rows.start, 0), (array.shape[0], rows.stop - rows.start, array.shape[2]))
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_obj_track_times(False)
    dcpl.set_virtual(virtual, b".", history.name.encode(), source)
    created = h5py.h5d.create(group.id, name.encode(), h5py.h5t.py_create(array.dtype), virtual, dcpl=dcpl)
    dataset = h5py.Dataset(created)
    dataset.attrs["sha256"] = digest
    stored[key] = dataset


def _write_arrays(
    group, arrays: Mapping[str, np.ndarray], compression: Compression, stored: dict
) -> dict[str, h5py.Dataset]:
    written = {}
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
        written[name] = group[name]
    return written


# --- reading -----------------------------------------------------------------------------


class GoldenFile:
    """A golden file opened for reading; every array read is checked against its sha256."""

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        if not Path(path).exists():
            raise GoldenFormatError(f"{self.path}: no such file")
        try:
            self._handle = h5py.File(path, "r")
        except OSError as error:
            raise GoldenFormatError(f"{self.path}: not an HDF5 file ({_first_line(error)})") from None
        try:
            self._check_root()
        except BaseException:
            self._handle.close()
            raise

    def __enter__(self) -> GoldenFile:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        self._handle.close()

    def _check_root(self) -> None:
        attrs = self._handle.attrs
        if _text(attrs.get("format")) != FORMAT:
            raise GoldenFormatError(
                f"{self.path}: not a csa-conform golden file (root attribute format != {FORMAT!r})"
            )
        version = attrs.get("schema_version")
        if version is None or int(version) != SCHEMA_VERSION:
            raise GoldenFormatError(
                f"{self.path}: schema_version {version} is not supported; this csa-conform reads "
                f"schema_version {SCHEMA_VERSION} (use a matching csa-conform or regenerate the file)"
            )
        if "cases" not in self._handle or not isinstance(self._handle["cases"], h5py.Group):
            raise GoldenFormatError(f"{self.path}: missing group /cases")

    @property
    def provenance(self) -> dict:
        return {key: _attr_value(value) for key, value in self._handle.attrs.items()}

    def case_ids(self) -> list[str]:
        return sorted(self._handle["cases"])

    def _case_group(self, case_id: str) -> h5py.Group:
        group = self._handle["cases"].get(case_id)
        if not isinstance(group, h5py.Group):
            raise GoldenFormatError(f"{self.path}: no case {case_id!r}")
        return group

    def _step_names(self, case_id: str) -> list[str]:
        steps = self._case_group(case_id).get("steps")
        if not isinstance(steps, h5py.Group) or not len(steps):
            raise GoldenFormatError(f"{self.path}: case {case_id!r} has no steps")
        names = sorted(steps)
        if names != [f"{index:04d}" for index in range(len(names))]:
            raise GoldenFormatError(
                f"{self.path}: case {case_id!r} steps must be named 0000, 0001, ...; got {names[:4]}"
            )
        return names

    def case_info(self, case_id: str) -> CaseInfo:
        group = self._case_group(case_id)
        attrs = group.attrs
        for required in ("attrs_json", "output_names_json"):
            if required not in attrs:
                raise GoldenFormatError(f"{self.path}: case {case_id!r} lacks attribute {required}")
        try:
            node_attrs = json.loads(_text(attrs["attrs_json"]))
            output_names = tuple(json.loads(_text(attrs["output_names_json"])))
        except json.JSONDecodeError as error:
            raise GoldenFormatError(f"{self.path}: case {case_id!r}: bad JSON attribute ({error})") from None
        names = self._step_names(case_id)
        steps = group["steps"]
        errors = tuple(i for i, name in enumerate(names) if "expect_error" in steps[name].attrs)
        seed = attrs.get("seed")
        return CaseInfo(
            case_id=case_id,
            attrs=node_attrs,
            output_names=output_names,
            family=_text(attrs.get("family", "")),
            seed=None if seed is None else int(seed),
            description=_text(attrs.get("description", "")),
            step_count=len(names),
            errors=errors,
        )

    def step_attrs(self, case_id: str, index: int) -> dict:
        node = self._case_group(case_id)["steps"][self._step_names(case_id)[index]]
        return {key: _attr_value(value) for key, value in node.attrs.items()}

    def step_count(self, case_id: str) -> int:
        return len(self._step_names(case_id))

    def read_step(self, case_id: str, index: int) -> GoldenStep:
        names = self._step_names(case_id)
        if not 0 <= index < len(names):
            raise GoldenFormatError(
                f"{self.path}: case {case_id!r} has {len(names)} steps; no step {index}"
            )
        node = self._case_group(case_id)["steps"][names[index]]
        if not isinstance(node, h5py.Group):
            raise GoldenFormatError(f"{self.path}: {node.name} should be a group")
        expect_error = node.attrs.get("expect_error")
        if "inputs" not in node:
            raise GoldenFormatError(f"{self.path}: {node.name} has no inputs group")
        if expect_error is None and "outputs" not in node:
            raise GoldenFormatError(f"{self.path}: {node.name} has neither outputs nor expect_error")
        stages = self._members(node["stages"], h5py.Group) if "stages" in node else {}
        return GoldenStep(
            inputs=self._read_arrays(node["inputs"]),
            outputs=self._read_arrays(node["outputs"]) if "outputs" in node else {},
            stages={name: self._read_arrays(group) for name, group in stages.items()},
            expect_error=None if expect_error is None else _text(expect_error),
        )

    def _members(self, group, kind) -> dict:
        """The members of a layout group, each required to be a group or a dataset.

        An ``inputs`` group lists in positional order (INPUT_NAMES, then
        unknown names); other groups in the order h5py lists them.
        """
        if not isinstance(group, h5py.Group):
            raise GoldenFormatError(f"{self.path}: {group.name} should be a group")
        members = dict(group.items())
        if group.name.rsplit("/", 1)[-1] == "inputs":
            members = dict(sorted(members.items(), key=_input_rank))
        for item in members.values():
            if not isinstance(item, kind):
                noun = "group" if kind is h5py.Group else "dataset"
                raise GoldenFormatError(f"{self.path}: {item.name} should be a {noun}")
        return members

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

    def verify_case_checksums(self, case_id: str) -> int:
        """Check every dataset of a case (kv history and hard links included); returns the count."""
        datasets = {}

        def collect(name, item) -> None:  # visititems stops at the first callback that returns a value
            if isinstance(item, h5py.Dataset):
                datasets.setdefault(h5py.h5o.get_info(item.id).addr, item)

        self._case_group(case_id).visititems(collect)
        for dataset in datasets.values():
            self.read_dataset(dataset)
        return len(datasets)

    def dataset_entries(self, case_id: str, index: int) -> list[tuple[str, h5py.Dataset]]:
        """(step-relative path, dataset) of one step, unread: inputs, stages, outputs.

        Inputs come in positional order; stages and outputs in creation order
        (pipeline order) in files this package writes, which track it; other
        files list them by name.
        """
        node = self._case_group(case_id)["steps"][self._step_names(case_id)[index]]
        groups = [("inputs", node.get("inputs"))]
        stages = self._members(node["stages"], h5py.Group) if "stages" in node else {}
        groups += [(f"stages/{stage}", group) for stage, group in stages.items()]
        groups.append(("outputs", node.get("outputs")))
        return [
            (f"{prefix}/{name}", dataset)
            for prefix, group in groups
            if group is not None
            for name, dataset in self._members(group, h5py.Dataset).items()
        ]

    def read_dataset(self, dataset: h5py.Dataset) -> np.ndarray:
        """The array of one dataset, refused unless its bytes match the sha256 attribute."""
        expected = dataset.attrs.get("sha256")
        if expected is None:
            raise GoldenFormatError(
                f"{self.path}: dataset {dataset.name} has no sha256 attribute (specs/golden-file.md)"
            )
        try:
            array = dataset[()]
        except (OSError, ValueError) as error:
            raise CorruptDataset(self.path, dataset.name, f"unreadable ({_first_line(error)})") from None
        array = np.asarray(array)
        actual = array_sha256(array)
        if actual != _text(expected):
            reason = f"sha256 mismatch (stored {_text(expected)[:16]}…, data {actual[:16]}…)"
            raise CorruptDataset(self.path, dataset.name, reason)
        return array

    def _read_arrays(self, group) -> dict[str, np.ndarray]:
        return {name: self.read_dataset(item) for name, item in self._members(group, h5py.Dataset).items()}


def _input_rank(member: tuple[str, object]) -> int:
    return _INPUT_RANK.get(member[0], len(_INPUT_RANK))


def _text(value) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray) and value.shape == ():
        return _text(value[()])
    return "" if value is None else str(value)


def _attr_value(value):
    if isinstance(value, (bytes, str)):
        return _text(value)
    if isinstance(value, np.generic):
        return value.item()
    return value


def _first_line(error: BaseException) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__
