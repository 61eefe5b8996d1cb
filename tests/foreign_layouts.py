"""Golden files as other tools may write them: the same cases, every dataset in another byte order,
chunking, filter or layout the golden spec allows. A reader must give each the plain file's verdict.

Datasets are rewritten one HDF5 object at a time (hard links stay links) with their attributes;
the digests cover values, not storage, so the file stays sealed.
"""

from __future__ import annotations

from pathlib import Path

import h5py

# name -> create_dataset options ("rows" chunks: one row of the last axis per chunk; "file": h5py.File options)
LAYOUTS = {
    "big-endian": {"byteorder": ">"},
    "big-endian-gzip-chunked-rows": {"byteorder": ">", "compression": "gzip", "chunks": "rows"},
    "contiguous-uncompressed": {},
    "chunked-rows-shuffle-fletcher32": {"chunks": "rows", "shuffle": True, "fletcher32": True},
    "gzip-9": {"compression": "gzip", "compression_opts": 9},
    "lzf-big-endian": {"byteorder": ">", "compression": "lzf"},
    # File-level choices: a 512-byte user block before the superblock, the newest object formats.
    "user-block-512": {"file": {"userblock_size": 512}},
    "libver-latest": {"file": {"libver": "latest"}, "compression": "gzip"},
}


def _options(layout: dict, data) -> dict:
    options = {key: value for key, value in layout.items() if key not in ("byteorder", "file")}
    if data.ndim == 0 or data.size == 0:
        return {}
    if options.get("chunks") == "rows":
        options["chunks"] = (1,) * (data.ndim - 1) + (data.shape[-1],)
    return options


def rewrite_layout(source: Path, target: Path, layout: dict) -> None:
    """``source`` copied to ``target`` with every dataset stored as ``layout`` says."""
    order = layout.get("byteorder")
    with h5py.File(source, "r") as original, h5py.File(target, "w", **layout.get("file", {})) as copy:
        made: dict[int, h5py.Dataset] = {}

        def attributes(from_object, to_object) -> None:
            for key, value in from_object.attrs.items():
                to_object.attrs[key] = value

        def walk(from_group, to_group) -> None:
            for name in from_group:
                item = from_group[name]
                address = h5py.h5o.get_info(item.id).addr
                if isinstance(item, h5py.Group):
                    child = to_group.create_group(name)
                    attributes(item, child)
                    walk(item, child)
                elif address in made:
                    to_group[name] = made[address]
                else:
                    data = item[()]
                    dtype = data.dtype.newbyteorder(order) if order and data.dtype.itemsize > 1 else data.dtype
                    dataset = to_group.create_dataset(name, data=data.astype(dtype), dtype=dtype,
                                                      **_options(layout, data))
                    attributes(item, dataset)
                    made[address] = dataset

        attributes(original, copy)
        walk(original, copy)
