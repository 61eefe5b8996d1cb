"""Chunks filtered where a case is made and copied in by ``ChunkCache`` make the file HDF5's own
filtered write makes, byte for byte: chunk cache evictions, chunks larger than the cache, edge chunks
in the middle of the chunk order, chunks left cached until the flush, an incompressible chunk."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import h5py
from csa_conform.golden.chunks import ChunkCache, chunk_offsets, lzf_chunks, store_array
from csa_conform.golden.lzf import read_into, threaded_options
from csa_conform.golden.layout import LIBVER
from csa_conform.golden.writer import FileSink

CACHE_BYTES = 64 << 10  # a small cache, so small arrays exercise every path of it


def arrays() -> list[tuple[np.ndarray, dict]]:
    rng = np.random.default_rng(7)
    lzf = {"compression": "lzf", "shuffle": True}
    gzip = {"compression": "gzip", "compression_opts": 4, "shuffle": True}
    return [
        (rng.standard_normal(100).astype(np.float32), {**gzip, "chunks": (100,)}),  # cached until the flush
        (rng.standard_normal((64, 1024)).astype(np.float32), {**lzf, "chunks": (4, 1024)}),  # evicted in order
        (rng.standard_normal((3, 1000, 16)).astype(np.float32), {**lzf, "chunks": (1, 300, 16)}),  # edge chunks inside
        (rng.standard_normal((50, 1000)).astype(np.float32), {**gzip, "chunks": (25, 1000)}),  # larger than the cache
        (rng.integers(0, 256, (40, 4096), dtype=np.uint8), {**lzf, "chunks": (5, 4096)}),  # incompressible
        (np.zeros((71, 333), dtype=np.int32), {**gzip, "chunks": (2, 333)}),  # 36 chunks, the last an edge
        (rng.standard_normal(10).astype(np.float64), {**gzip, "chunks": (10,)}),
    ]


def image(write, folder: Path) -> bytes:
    """The file ``write`` makes of every array, written as the writer writes (its FileSink)."""
    path = folder / f"{write.__name__}.h5"
    with open(path, "w+b") as output:
        with h5py.File(FileSink(output), "w", libver=LIBVER, rdcc_nbytes=CACHE_BYTES) as handle:
            cache = ChunkCache()
            datasets = []
            for index, (array, options) in enumerate(arrays()):
                dataset = write(handle, f"a{index}", array, options, cache)
                dataset.attrs["sha256"] = "0" * 64
                datasets.append(dataset)  # kept open, as the writer keeps them
            handle.attrs["done"] = 1
            cache.flush()
    return path.read_bytes()


def hdf5_itself(handle, name, array, options, _cache):
    return handle.create_dataset(name, data=array, **options)


def copied_in(handle, name, array, options, cache):
    stored = store_array(array, options, "0" * 64)
    dataset = handle.create_dataset(name, shape=stored.shape, dtype=stored.dtype, **options)
    cache.write(dataset, stored.chunks)
    return dataset


def test_copied_chunks_make_the_file_hdf5_makes(tmp_path):
    assert image(copied_in, tmp_path) == image(hdf5_itself, tmp_path)


def test_the_arrays_cover_every_path_of_the_cache():
    stored = [store_array(array, options, "") for array, options in arrays()]
    sizes = [int(np.prod(options["chunks"])) * array.dtype.itemsize for array, options in arrays()]
    assert any(size > CACHE_BYTES for size in sizes) and any(len(s.chunks) * size > CACHE_BYTES
                                                               for s, size in zip(stored, sizes) if size <= CACHE_BYTES)
    edges = stored[2].chunks
    assert [chunk.complete for chunk in edges[:4]] == [True, True, True, False] and len(edges) == 12
    assert any(chunk.filter_mask for chunk in stored[4].chunks), "lzf should have given up on random bytes"


@pytest.mark.parametrize("order", [[0, 1, 2], [2, 0, 1]])
def test_a_stored_array_reads_back_as_the_array(tmp_path, order):
    path = tmp_path / "read.h5"
    chosen = [arrays()[index] for index in order]
    with h5py.File(path, "w", libver=LIBVER) as handle:
        cache = ChunkCache()
        for index, (array, options) in enumerate(chosen):
            copied_in(handle, f"a{index}", array, options, cache)
        cache.flush()
    with h5py.File(path, "r") as handle:
        for index, (array, _) in enumerate(chosen):
            assert np.array_equal(handle[f"a{index}"][()], array)


def hdf5_chunks(array: np.ndarray, options: dict) -> list[tuple[tuple[int, ...], int, bytes]]:
    with h5py.File("chunks-test-hdf5.h5", "w", driver="core", backing_store=False, libver=LIBVER) as handle:
        dataset = handle.create_dataset("a", data=array, **options)
        handle.flush()
        return [(offset, *dataset.id.read_direct_chunk(offset)) for offset in chunk_offsets(array.shape, dataset.chunks)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.uint8])
@pytest.mark.parametrize("shuffle", [True, False])
def test_lzf_on_threads_gives_hdf5s_chunks(dtype, shuffle):
    """Shuffle ported, lzf called directly, edge chunks zero-filled, incompressible chunks stored
    shuffled with lzf's mask bit: each chunk the bytes and mask HDF5's own pipeline gives."""
    assert threaded_options({"compression": "lzf", "shuffle": shuffle, "chunks": (1,)})
    rng = np.random.default_rng(11)
    smooth = np.repeat(rng.standard_normal((5, 70, 1)), 9, axis=2).astype(dtype)  # compresses
    noise = rng.integers(0, 256, (5, 70, 9 * np.dtype(dtype).itemsize), dtype=np.uint8).view(dtype)  # does not
    array = np.concatenate([smooth, noise], axis=0)
    options = {"compression": "lzf", "shuffle": shuffle, "chunks": (1, 30, 9)}  # 30 rows of 70: edge chunks
    with ThreadPoolExecutor(3) as pool:
        ours = [future.result() for future in lzf_chunks(array, options, pool)]
    theirs = hdf5_chunks(array, options)
    assert [(chunk.offset, chunk.filter_mask, bytes(chunk.data)) for chunk in ours] == theirs
    masks = {chunk.filter_mask for chunk in ours}
    assert masks == {0, 0b10 if shuffle else 0b01}, "both compressed and incompressible chunks are covered"
    assert not all(chunk.complete for chunk in ours)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.uint8])
@pytest.mark.parametrize("shuffle", [True, False])
def test_lzf_read_on_threads_gives_what_hdf5_reads(tmp_path, dtype, shuffle):
    """Compressed and incompressible chunks, edge chunks: read_into fills the array HDF5's read gives."""
    rng = np.random.default_rng(5)
    smooth = np.repeat(rng.standard_normal((4, 70, 1)), 9, axis=2).astype(dtype)
    noise = rng.integers(0, 256, (3, 70, 9 * np.dtype(dtype).itemsize), dtype=np.uint8).view(dtype)
    array = np.concatenate([smooth, noise], axis=0)
    with h5py.File(tmp_path / "lzf.h5", "w") as handle:
        dataset = handle.create_dataset("a", data=array, compression="lzf", shuffle=shuffle, chunks=(1, 30, 9))
        masks = {dataset.id.read_direct_chunk(offset)[0] for offset in chunk_offsets(array.shape, dataset.chunks)}
        assert len(masks) == 2, "both compressed and stored-as-is chunks"
        read = np.full(array.shape, 7, dtype=array.dtype)
        assert read_into(dataset, read)
        assert read.tobytes() == array.tobytes()


def test_lzf_read_leaves_damage_and_other_pipelines_to_hdf5(tmp_path):
    rng = np.random.default_rng(6)
    array = np.repeat(rng.standard_normal((6, 40, 1)), 8, axis=2).astype(np.float32)
    with h5py.File(tmp_path / "other.h5", "w") as handle:
        gzip = handle.create_dataset("gzip", data=array, compression="gzip", chunks=(1, 40, 8))
        big_endian = handle.create_dataset("be", data=array.astype(">f4"), compression="lzf", chunks=(1, 40, 8))
        damaged = handle.create_dataset("damaged", shape=array.shape, dtype=array.dtype, compression="lzf",
                                        shuffle=True, chunks=(1, 40, 8))
        damaged[...] = array
        mask, data = damaged.id.read_direct_chunk((2, 0, 0))
        damaged.id.write_direct_chunk((2, 0, 0), data[: len(data) // 2], mask)  # truncated lzf stream
        unfiltered = handle.create_dataset("unfiltered", shape=array.shape, dtype=array.dtype, compression="lzf",
                                           shuffle=True, chunks=(1, 40, 8))
        unfiltered[...] = array
        unfiltered.id.write_direct_chunk((1, 0, 0), array[1:2].tobytes(), 0b11)  # neither filter applied
        partial = handle.create_dataset("partial", shape=array.shape, dtype=array.dtype, compression="lzf",
                                        chunks=(1, 40, 8))
        partial[:3] = array[:3]  # chunks 3.. never written: HDF5 reads the fill value
        out = np.empty_like(array)
        assert not read_into(gzip, out)
        assert not read_into(big_endian, out)
        assert not read_into(damaged, out)
        assert not read_into(unfiltered, out)
        assert np.array_equal(unfiltered[()], array), "HDF5 itself reads such a chunk"
        assert not read_into(partial, out)
