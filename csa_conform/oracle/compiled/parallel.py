"""Query-row chunking over a thread pool.

NumPy releases the GIL inside its ufunc loops, so independent query chunks
run on every core; each chunk keeps its working set near cache size.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

WORKING_SET_ELEMENTS = 1 << 16


def query_chunks(sequence: int, elements_per_query: int, working_set: int | None = None) -> list[slice]:
    size = max(1, (working_set or WORKING_SET_ELEMENTS) // max(1, elements_per_query))
    return [slice(begin, min(sequence, begin + size)) for begin in range(0, sequence, size)]


def even_parts(size: int, parts: int) -> list[slice]:
    """``size`` split into at most ``parts`` contiguous ranges of nearly equal length (one empty
    range when ``size`` is 0)."""
    count = max(1, min(parts, size))
    bounds = [size * index // count for index in range(count + 1)]
    return [slice(begin, end) for begin, end in zip(bounds[:-1], bounds[1:])]


def map_chunks(function: Callable[[slice], object], chunks: list[slice]) -> list:
    workers = min(len(chunks), worker_count())
    if workers <= 1:
        return [function(chunk) for chunk in chunks]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(function, chunks))


_processes = 1  # worker processes sharing this machine's cores (--jobs)


def share_cores(processes: int) -> None:
    """Called in each of ``processes`` worker processes, so that all their threads together use each core once."""
    global _processes
    _processes = max(1, processes)


def worker_count() -> int:
    """Threads per map (the cores, shared between --jobs processes); tests vary it to show no result depends on it."""
    return max(1, (os.cpu_count() or 1) // _processes)
