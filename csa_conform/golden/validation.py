"""What a golden file reader refuses, checked object by object as a reader reaches it.

Whatever HDF5 says about a damaged file (an unreadable header, a soft or
external link, a virtual or external dataset, a filter it may not use, a
declared size it never stored, a checksum that does not match) becomes one
``GoldenFormatError``, ``GoldenIntegrityError`` or ``CorruptDataset`` naming
the file and the object (specs/golden-file.md).
"""

from __future__ import annotations

import os
import re
import stat
from contextlib import contextmanager
from typing import Iterator

import h5py
import numpy as np

from csa_conform._base import bounded_json
from csa_conform._base.memory import address_space_left, allocate
from csa_conform.errors import CorruptDataset, CsaConformError, GoldenFormatError, GoldenIntegrityError, MemoryShortage
from csa_conform.golden import lzf
from csa_conform.golden.digest import array_sha256, manifest_digest
from csa_conform.golden.layout import (
    CASE_DIGEST,
    FORMAT,
    MANIFEST_DIGEST,
    READABLE_SCHEMAS,
    SCHEMA_VERSION,
    TensorEntry,
)

# Deflate cannot expand data more than 1032-fold; a dataset claiming more is not what it says.
DEFLATE_MAX_RATIO = 1100
ALLOWED_FILTERS = {h5py.h5z.FILTER_DEFLATE, h5py.h5z.FILTER_SHUFFLE, h5py.h5z.FILTER_FLETCHER32, 32000}
COMPRESSING_FILTERS = {h5py.h5z.FILTER_DEFLATE, 32000}
MAX_TEXT_BYTES = 1 << 20
MAX_GROUP_DEPTH = 16
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
# What h5py raises when the bytes under it are damaged (heaps, headers, B-trees, filters).
DAMAGE = (
    OSError, ValueError, KeyError, RuntimeError, TypeError, AttributeError, IndexError,
    OverflowError, MemoryError, RecursionError, SystemError,
)


class CheckedFile:
    """An HDF5 file opened read-only whose objects are checked as they are reached."""

    def __init__(self, path: str):
        self.path = path
        require_regular_file(path)
        refuse_appended_bytes(path)
        try:
            self.handle = h5py.File(path, "r")
        except DAMAGE as error:
            raise GoldenFormatError(f"{path}: not an HDF5 file ({first_line(error)})") from None

    def close(self) -> None:
        try:
            self.handle.close()
        except DAMAGE:
            pass

    @contextmanager
    def guard(self, where: str) -> Iterator[None]:
        try:
            yield
        except CsaConformError:
            raise
        except DAMAGE as error:
            refuse_memory_shortage(error, f"{self.path}: {where}")
            problem = f"{type(error).__name__}: {first_line(error)}"
            raise GoldenFormatError(f"{self.path}: {where}: damaged or unreadable ({problem})") from None

    def traverse(self) -> None:
        """Visit every object once, so damage in headers no command reads is still reported.

        Iterative and bounded in depth (MAX_GROUP_DEPTH): HDF5's own visit builds every object's
        full path, which for a chain of 20,000 nested groups never ends.
        """
        visited = ["/"]
        pending = [(self.handle.id, "", 0)]
        try:
            seen = {h5py.h5o.get_info(self.handle.id).addr}
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
        except DAMAGE as error:
            refuse_memory_shortage(error, f"{self.path}: /{visited[-1].lstrip('/')}")
            problem = f"{type(error).__name__}: {first_line(error)}"
            raise GoldenFormatError(
                f"{self.path}: damaged object after /{visited[-1].lstrip('/')} ({problem})"
            ) from None

    def check_root(self) -> int:
        attrs = self.handle.attrs
        if plain_text(attrs.get("format")) != FORMAT:
            raise GoldenFormatError(
                f"{self.path}: not a csa-conform golden file (root attribute format != {FORMAT!r})"
            )
        version = attrs.get("schema_version")
        integer = isinstance(version, (int, np.integer)) and not isinstance(version, (bool, np.bool_))
        if not integer or int(version) not in READABLE_SCHEMAS:
            shown = repr(attr_value(version)) if not integer else str(int(version))
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
        self.require_group(self.handle, "cases")
        return version

    def root_attrs(self) -> dict:
        values = {}
        for key in self.handle.attrs:
            value = attr_value(self.handle.attrs[key])
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise GoldenFormatError(f"{self.path}: root attribute {key!r} is not text or a number")
            values[key] = value
        return values

    def check_manifest(self, schema_version: int) -> tuple[list[str], str]:
        root = self.root_attrs()
        cases = self.require_group(self.handle, "cases")
        case_ids = sorted(self.member_names(cases))
        if schema_version == 1:
            return case_ids, manifest_digest(root, {case_id: "" for case_id in case_ids})
        stored = self.digest_attr(self.handle, MANIFEST_DIGEST, "/")
        digests = {}
        for case_id in case_ids:
            group = self.member(cases, case_id, h5py.Group, checked=True)
            digests[case_id] = self.digest_attr(group, CASE_DIGEST, group.name)
        computed = manifest_digest(root, digests)
        if computed != stored:
            raise GoldenIntegrityError(
                self.path, "/",
                f"{MANIFEST_DIGEST} mismatch (stored {stored}, computed {computed}): "
                "the root attributes or the list of cases changed",
            )
        return case_ids, stored

    def digest_attr(self, obj, name: str, where: str) -> str:
        value = self.text_attr(obj, name, where)
        if value is None or not _HEX_DIGEST.fullmatch(value):
            raise GoldenFormatError(f"{self.path}: {where}: attribute {name} is not a sha256 hex digest")
        return value

    def member_names(self, group: h5py.Group) -> list[str]:
        names = list(group)
        for name in names:
            self.hard_link(group, name)
        return names

    def hard_link(self, group: h5py.Group, name: str) -> None:
        link = group.get(name, getlink=True)
        if link is None:
            raise GoldenFormatError(f"{self.path}: {group.name} has no member {name!r}")
        if not isinstance(link, h5py.HardLink):
            kind = "an external link" if isinstance(link, h5py.ExternalLink) else "a soft link"
            raise GoldenFormatError(
                f"{self.path}: {group.name.rstrip('/')}/{name} is {kind}; golden files hold hard links only"
            )

    def member(self, group: h5py.Group, name: str, kind, checked: bool = False):
        if not checked:
            self.hard_link(group, name)
        item = group[name]
        if not isinstance(item, kind):
            noun = "group" if kind is h5py.Group else "dataset"
            raise GoldenFormatError(f"{self.path}: {item.name} should be a {noun}")
        return item

    def require_group(self, group, name: str) -> h5py.Group:
        if name not in self.member_names(group):
            raise GoldenFormatError(f"{self.path}: missing group {group.name.rstrip('/')}/{name}")
        return self.member(group, name, h5py.Group)

    def text_attr(self, obj, name: str, where: str) -> str | None:
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

    def json_attr(self, obj, name: str, where: str, non_finite: bool = False):
        text = self.text_attr(obj, name, where)
        if text is None:
            raise GoldenFormatError(f"{self.path}: {where} lacks attribute {name}")
        try:
            return bounded_json.parse(text, non_finite=non_finite)
        except ValueError as error:
            problem = first_line(error)
            raise GoldenFormatError(f"{self.path}: {where}: attribute {name} is not JSON a golden file may hold "
                                    f"({problem})") from None

    def entry(self, dataset: h5py.Dataset, path: str) -> TensorEntry:
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
        digest = self.text_attr(dataset, "sha256", where)
        if digest is None:
            raise GoldenFormatError(f"{self.path}: dataset {where} has no sha256 attribute (specs/golden-file.md)")
        if not _HEX_DIGEST.fullmatch(digest):
            raise GoldenFormatError(f"{self.path}: {where}: attribute sha256 is not a sha256 hex digest")
        return TensorEntry(path, entry.dtype, shape, digest)

    def read(self, entry: TensorEntry, dataset: h5py.Dataset) -> np.ndarray:
        array = self.read_unchecked(entry, dataset)
        self.check_digest(entry, dataset, array)
        return array

    def read_unchecked(self, entry: TensorEntry, dataset: h5py.Dataset) -> np.ndarray:
        """The dataset's array, its sha256 not yet compared (``check_digest``)."""
        where = dataset.name
        # Sized up front, in native byte order: HDF5 converts a big-endian dataset while reading, and
        # a memory limit shows as what it is before any byte is read.
        array = allocate(entry.shape, entry.dtype, f"{self.path}: {where}")
        try:
            if array.size and not lzf.read_into(dataset, array):
                dataset.read_direct(array)
        except DAMAGE as error:
            raise CorruptDataset(self.path, where, f"unreadable ({first_line(error)})") from None
        if array.shape != entry.shape:
            raise CorruptDataset(self.path, where, f"read shape {array.shape}, declared {entry.shape}")
        return array

    def check_digest(self, entry: TensorEntry, dataset: h5py.Dataset, array: np.ndarray) -> None:
        actual = array_sha256(array)
        if actual != entry.sha256:
            raise CorruptDataset(self.path, dataset.name, f"sha256 mismatch (stored {entry.sha256}, data {actual})")


def refuse_memory_shortage(error: BaseException, where: str) -> None:
    """Under an address-space limit a MemoryError from HDF5 is the limit (exit 4); without one, a header
    that asks for absurd memory is damage (the caller's GoldenFormatError)."""
    bound = address_space_left()
    if isinstance(error, MemoryError) and bound is not None:
        raise MemoryShortage(f"{where}: out of memory reading the file's metadata under the {bound[1]}") from None


def require_regular_file(path: str) -> None:
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


def refuse_appended_bytes(path: str) -> None:
    """A file longer than its HDF5 data (bytes or a sparse hole appended) is not the file that was written.

    Reading it would still work, but hashing it for the results document would read every appended byte.
    """
    end = _hdf5_end(path)
    size = os.path.getsize(path)
    if end is not None and size > end:
        raise GoldenFormatError(f"{path}: {size - end} bytes follow the end of its HDF5 data (at byte {end}); "
                                "a golden file holds nothing after its data")

def plain_text(value) -> str | None:
    if isinstance(value, np.ndarray) and value.shape == ():
        value = value[()]
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value if isinstance(value, str) else None


def attr_value(value):
    text = plain_text(value)
    if text is not None:
        return text
    if isinstance(value, np.generic):
        return value.item()
    return value


def first_line(error: BaseException) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__

