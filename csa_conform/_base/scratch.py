"""Scratch folders that go when the process that made them does: at a normal exit, and on SIGTERM, whose
handler ends the process with os._exit (so no code it interrupted runs on, and no atexit callback either)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

_FOLDERS: list[Path] = []
_OWNER: list[int] = []  # the process that made them: a forked worker's exit must not remove its parent's


def scratch_folder(prefix: str) -> Path:
    """A new private folder under the temporary directory, removed with this process."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    if not _FOLDERS:
        atexit.register(remove_scratch)
    _FOLDERS.append(path)
    _OWNER[:] = [os.getpid()]
    return path


def remove_scratch() -> None:
    """Remove this process's scratch folders (none in a process forked from their maker)."""
    if _OWNER != [os.getpid()]:
        return
    while _FOLDERS:
        shutil.rmtree(_FOLDERS.pop(), ignore_errors=True)
