"""lzf chunks on every core: h5py's own lzf functions and HDF5's shuffle filter, outside HDF5's pipeline.

HDF5 runs a dataset's filters chunk by chunk under h5py's global lock, so
compressing (generate) and decompressing (verify) the large lzf datasets,
nearly all of the prod suite's bytes, kept to one core. Here the lzf step is
the very ``lzf_compress``/``lzf_decompress`` h5py's filter calls (its h5z
module exports them; ctypes releases the GIL around them) with the room the
filter gives them, and the shuffle filter is the byte transposition it is,
so a chunk comes out as HDF5 makes or reads it, on as many threads as there
are cores. A chunk lzf could not shrink is stored shuffled with lzf's bit
set in its filter mask, as HDF5 stores it. Where this h5py build exports no
lzf functions, nothing here is used (``available`` is False).
"""

from __future__ import annotations

import ctypes
import itertools
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import h5py
import numpy as np
from h5py import h5z

from csa_conform.oracle.compiled.parallel import worker_count

__all__ = ["FILTER_LZF", "available", "chunk_offsets", "compress", "pool", "read_into", "shuffle", "threaded_options"]

FILTER_LZF = 32000  # h5py's registered lzf filter id


def _bound(name: str):
    """h5py's ``name``(in, in_len, out, out_len) -> bytes written, 0 when they do not fit (or None)."""
    try:
        function = getattr(ctypes.CDLL(h5z.__file__), name)
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_uint
    function.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_uint]
    return function


_COMPRESS = _bound("lzf_compress")
_DECOMPRESS = _bound("lzf_decompress")
available = _COMPRESS is not None and _DECOMPRESS is not None
_BUFFERS = threading.local()  # each thread's chunk-sized scratch buffers, reused chunk after chunk


_POOL: dict[tuple[int, int], ThreadPoolExecutor] = {}  # (pid, threads) -> the process's filtering threads


def pool() -> ThreadPoolExecutor:
    """The threads that filter chunks, one per core this process may use, kept for the process's life:
    their scratch buffers are then reused from dataset to dataset instead of being fresh memory for
    each (a forked worker makes its own)."""
    key = (os.getpid(), worker_count())
    if key not in _POOL:
        _POOL[key] = ThreadPoolExecutor(key[1], thread_name_prefix="lzf")
    return _POOL[key]


def chunk_offsets(shape: tuple[int, ...], chunks: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every chunk's offset, in the order HDF5 writes a whole array (row-major over the chunk grid)."""
    axes = [range(0, extent, step) for extent, step in zip(shape, chunks)]
    return [tuple(offset) for offset in itertools.product(*axes)]


def threaded_options(options: dict) -> bool:
    """Whether an array written under h5py ``options`` is one this module filters: lzf, shuffled
    or not, and nothing else in the pipeline."""
    return available and options.get("compression") == "lzf" and set(options) <= {"compression", "shuffle", "chunks"}


def _buffer(name: str, size: int) -> np.ndarray:
    buffer = getattr(_BUFFERS, name, None)
    if buffer is None or buffer.size != size:
        buffer = np.empty(size, dtype=np.uint8)
        setattr(_BUFFERS, name, buffer)
    return buffer


def shuffle(raw: np.ndarray, itemsize: int) -> np.ndarray:
    """HDF5's shuffle filter: byte k of every element, for k = 0 .. itemsize-1 (in a thread's buffer)."""
    if itemsize <= 1:
        return raw
    shuffled = _buffer("shuffled", raw.size)
    shuffled.reshape(itemsize, -1)[...] = raw.reshape(-1, itemsize).T
    return shuffled


def compress(shuffled: np.ndarray) -> bytes | None:
    """lzf of ``shuffled`` (a whole chunk) given the room h5py's filter gives it, the chunk's size,
    in a thread's buffer: the compressed bytes, None when they do not fit (HDF5 then skips the
    optional filter). Only the compressed bytes are new memory."""
    room = _buffer("compressed", shuffled.size)
    length = _COMPRESS(shuffled.ctypes.data, shuffled.size, room.ctypes.data, room.size)
    return room[:length].tobytes() if length else None


class _NotReadHere(Exception):
    """A chunk this module does not read; HDF5 reads the dataset instead."""


def read_into(dataset: h5py.Dataset, array: np.ndarray) -> bool:
    """``dataset``'s values into ``array`` (its shape and byte order), its lzf chunks decompressed
    on every core. False, ``array`` then unspecified, when the
    dataset is not one this reads: another pipeline or byte order, a chunk missing, a mask other
    than 0 or lzf's, a chunk that does not decompress to its size. The caller then has HDF5 read it,
    which keeps HDF5's own verdict on anything damaged."""
    if not available or array.dtype != dataset.dtype or dataset.chunks is None:
        return False
    plist = dataset.id.get_create_plist()
    filters = [plist.get_filter(index)[0] for index in range(plist.get_nfilters())]
    if filters not in ([h5z.FILTER_SHUFFLE, FILTER_LZF], [FILTER_LZF]):
        return False
    chunks, shape = dataset.chunks, dataset.shape
    offsets = chunk_offsets(shape, chunks)
    if dataset.id.get_num_chunks() != len(offsets):
        return False
    itemsize = array.dtype.itemsize if filters[0] == h5z.FILTER_SHUFFLE else 1
    lzf_bit = 1 << filters.index(FILTER_LZF)
    size = int(np.prod(chunks)) * array.dtype.itemsize

    def chunk(offset: tuple[int, ...]) -> None:
        stored = _buffer("stored", size)  # a stored chunk larger than the chunk is refused by h5py: damage
        mask, data = dataset.id.read_direct_chunk(offset, out=stored)
        length = len(data)
        if mask == 0:
            shuffled = _buffer("shuffled", size)
            if _DECOMPRESS(stored.ctypes.data, length, shuffled.ctypes.data, size) != size:
                raise _NotReadHere
        elif mask == lzf_bit and length == size:
            shuffled = stored
        else:
            raise _NotReadHere
        inside = tuple(slice(start, min(start + step, extent)) for start, step, extent in zip(offset, chunks, shape))
        target = array[inside]
        if target.shape == tuple(chunks) and target.flags.c_contiguous:
            _unshuffle(shuffled, itemsize, target.reshape(-1).view(np.uint8))
        else:
            whole = _buffer("whole", size)
            _unshuffle(shuffled, itemsize, whole)
            target[...] = whole.view(array.dtype).reshape(chunks)[tuple(slice(0, n) for n in target.shape)]

    try:
        for _ in pool().map(chunk, offsets):
            pass
    except (_NotReadHere, OSError, ValueError, KeyError, RuntimeError):
        return False
    return True


_WORDS = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def _unshuffle(shuffled: np.ndarray, itemsize: int, out: np.ndarray) -> None:
    """The shuffle filter undone into ``out``. On a little-endian machine byte k of an element is
    bits 8k.. of its word, so the elements are assembled by shifts and ors, a few times faster
    than NumPy's transposing copy with its inner axis of ``itemsize`` bytes."""
    if itemsize <= 1:
        out[...] = shuffled
        return
    word = _WORDS.get(itemsize)
    if word is None or sys.byteorder != "little":
        out.reshape(-1, itemsize)[...] = shuffled.reshape(itemsize, -1).T
        return
    words, planes = out.view(word), shuffled.reshape(itemsize, -1)
    part = _buffer(f"word{itemsize}", out.size).view(word)
    np.copyto(words, planes[0], casting="unsafe")
    for byte in range(1, itemsize):
        np.copyto(part, planes[byte], casting="unsafe")
        np.left_shift(part, 8 * byte, out=part)
        np.bitwise_or(words, part, out=words)
