"""A file that appears complete or not at all, whatever stops the process that writes it.

Python delivers SIGINT as a KeyboardInterrupt wherever the interpreter
happens to be, including inside object finalizers, where it is printed and
dropped ("Exception ignored in ...") and the write carries on. So while a
file is being written, SIGINT and SIGTERM are handled here: the worker
processes computing its contents are stopped, the temporary file is removed
and the process exits with 128 + the signal number at once.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from csa_conform.errors import UsageError

SIGNALS = (signal.SIGINT, signal.SIGTERM)

__all__ = ["atomic_file"]


@contextmanager
def atomic_file(path: Path, *, replace: bool) -> Iterator[Path]:
    """Yield a temporary name next to ``path``; move it into place when the block completes.

    Without ``replace`` the file is linked into place, which fails when
    ``path`` appeared while the block ran instead of overwriting it.
    """
    descriptor, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(descriptor)
    temporary = Path(name)
    with _signals_remove(temporary):
        try:
            yield temporary
            umask = os.umask(0)
            os.umask(umask)
            # mkstemp makes the file private (0600); give it the mode a plain open() would.
            os.chmod(temporary, 0o666 & ~umask)
            _commit(temporary, path, replace)
        finally:
            temporary.unlink(missing_ok=True)


def _commit(temporary: Path, path: Path, replace: bool) -> None:
    if replace:
        os.replace(temporary, path)
        return
    try:
        os.link(temporary, path)
    except FileExistsError:
        raise UsageError(f"{path} appeared while it was being written; pass --force to overwrite it") from None


@contextmanager
def _signals_remove(temporary: Path) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def remove_and_exit(number, _frame) -> None:
        for worker in multiprocessing.active_children():
            worker.kill()
        try:
            os.unlink(temporary)
        except OSError:
            pass
        name = "interrupted" if number == signal.SIGINT else "terminated"
        os.write(sys.stderr.fileno(), f"csa-conform: error: {name}; nothing written\n".encode())
        os._exit(128 + number)

    previous = {number: signal.signal(number, remove_and_exit) for number in SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
