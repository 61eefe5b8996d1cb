"""Work counted, not timed: how a test says "at once" or "linear" without reading a clock.

Seconds depend on the machine and on what else runs on it (a loaded 2-core machine failed a timed
bound); the bytes a process reads and the lines of code it runs do not. Speed is measured by hand
in benchmarks/.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, TypeVar

T = TypeVar("T")


def _read_chars() -> int:
    """Bytes this process has read through read(2) and its kin, from any file (/proc/self/io's rchar)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("/proc/self/io has no rchar line")


def bytes_read(call: Callable[[], T]) -> tuple[T, int]:
    """What ``call`` returned and the bytes the process read while it ran (every file: a bound, not a tally)."""
    before = _read_chars()
    result = call()
    return result, _read_chars() - before


def lines_run(call: Callable[[], object], *packages) -> int:
    """The lines of Python ``call`` ran in the given packages' source files (each a module): a count that
    grows with the work an algorithm does, loops included, and never with the machine's load."""
    roots = tuple(str(Path(package.__file__).parent) for package in packages)
    count = 0

    def local(frame, event, arg):
        nonlocal count
        count += event == "line"
        return local

    def enter(frame, event, arg):
        return local if frame.f_code.co_filename.startswith(roots) else None

    previous = sys.gettrace()
    sys.settrace(enter)
    try:
        call()
    finally:
        sys.settrace(previous)
    return count
