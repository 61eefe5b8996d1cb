"""A file that appears complete or not at all, whatever stops the process that writes it.

The file is written unnamed (Linux ``O_TMPFILE`` in the target's folder)
and linked into place once complete (``linkat`` through /proc/self/fd), so
even SIGKILL or a power cut mid-write leaves nothing visible. Replacing a
file links it under a short temporary name first and renames that over the
target, so the temporary fits beside any legal target name. Where the file
system has no ``O_TMPFILE`` (or /proc is not mounted), the file is written
under such a temporary name from the start; each temporary names the
process that made it, and every later write into the folder removes those
whose process is gone.

Only regular files are written or replaced: a FIFO, a device node or a
folder under the target name is refused, ``--force`` or not.

Python delivers SIGINT as a KeyboardInterrupt wherever the interpreter
happens to be, including inside object finalizers, where it is printed and
dropped ("Exception ignored in ...") and the write carries on. So while a
file is being written, SIGINT and SIGTERM are handled here: the worker
processes computing its contents are stopped, a named temporary is removed
and the process exits with 128 + the signal number at once.
"""

from __future__ import annotations

import errno
import multiprocessing
import os
import re
import secrets
import signal
import stat
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from csa_conform.errors import OutputWriteError, UsageError

SIGNALS = (signal.SIGINT, signal.SIGTERM)
TEMPORARY_PREFIX = ".csa-conform-"
_TEMPORARY = re.compile(re.escape(TEMPORARY_PREFIX) + r"(\d+)-[0-9a-f]{8}\.tmp")

__all__ = ["atomic_file", "refuse_special_target", "write_atomically", "written"]


def refuse_special_target(path: Path) -> None:
    """Refuse a target that exists and is not a regular file (FIFO, device, socket, folder)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as error:
        raise UsageError(f"{path}: cannot write ({error.strerror})") from None
    if not stat.S_ISREG(mode):
        raise UsageError(f"{path}: exists and is not a regular file; refusing to replace it (even with --force)")


@contextmanager
def atomic_file(path: Path, *, replace: bool) -> Iterator[_Output]:
    """Yield the file to write (``write(bytes)``); it appears under ``path`` only when the block completes.

    Without ``replace`` the file is linked into place, which fails when
    ``path`` appeared while the block ran instead of overwriting it.
    """
    path = Path(path)
    refuse_special_target(path)
    folder = path.parent
    _remove_stale_temporaries(folder)
    handle, named = _create(folder)
    with _signals_remove(named):
        try:
            yield handle
            with written(path):
                os.fsync(handle.fileno())
                refuse_special_target(path)
                _commit(handle, named, path, replace)
        finally:
            os.close(handle.fileno())
            if named is not None:
                _unlink(named)


def write_atomically(path: Path, data: bytes, *, replace: bool = True) -> None:
    """``data`` as the whole content of ``path``, written by ``atomic_file``."""
    with atomic_file(path, replace=replace) as handle, written(path):
        handle.write(data)


@contextmanager
def written(path: Path) -> Iterator[None]:
    """A failed write (full disk, file size limit, I/O error) as one OutputWriteError (exit 4)."""
    try:
        yield
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise OutputWriteError(f"{path}: cannot write ({reason}); nothing written") from None


def _temporary_name(folder: Path) -> Path:
    return folder / f"{TEMPORARY_PREFIX}{os.getpid()}-{secrets.token_hex(4)}.tmp"


class _Output:
    """The file being written, unbuffered: each write is all of it or an OSError (never a short write),
    and nothing is left in a buffer to fail again when the descriptor is closed."""

    def __init__(self, descriptor: int):
        self._descriptor = descriptor

    def fileno(self) -> int:
        return self._descriptor

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        while view:
            view = view[os.write(self._descriptor, view):]
        return len(data)

    def read_at(self, offset: int, size: int) -> bytes:
        return os.pread(self._descriptor, size, offset)


def _create(folder: Path) -> tuple[_Output, Path | None]:
    """An unnamed file in ``folder`` (name None), else a named temporary there."""
    if hasattr(os, "O_TMPFILE") and os.path.isdir("/proc/self/fd"):
        try:
            return _Output(os.open(folder, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o666)), None
        except OSError as error:
            # Kernels and file systems without O_TMPFILE say so in one of these ways.
            if error.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
    named = _temporary_name(folder)
    return _Output(os.open(named, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o666)), named


def _commit(handle: _Output, named: Path | None, path: Path, replace: bool) -> None:
    if named is None:
        if not replace:
            _link_new(handle, None, path)
            return
        named = _temporary_name(path.parent)
        try:
            _link_unnamed(handle, named)
        except OSError as error:
            if error.errno not in _NO_PROC_LINK:
                raise
            _copy_to(handle, named)
        try:
            os.replace(named, path)
        finally:
            _unlink(named)
        return
    if replace:
        os.replace(named, path)
    else:
        _link_new(None, named, path)


# linkat through /proc/self/fd can be refused where /proc is another file system or not Linux's own.
_NO_PROC_LINK = (errno.EXDEV, errno.EPERM, errno.ENOENT, errno.EOPNOTSUPP)


def _link_unnamed(handle: _Output, target: Path) -> None:
    """linkat(AT_SYMLINK_FOLLOW) of /proc/self/fd/N; os.link makes that call only when given a dir fd
    (otherwise it calls link(), which links the /proc symlink itself and fails)."""
    descriptor = handle.fileno()
    os.link(f"/proc/self/fd/{descriptor}", target, src_dir_fd=descriptor, follow_symlinks=True)


def _copy_to(handle: _Output, named: Path) -> None:
    """The unnamed file's bytes under a named temporary (where it cannot be linked), synced."""
    with open(named, "xb") as copy:
        offset = 0
        while block := handle.read_at(offset, 1 << 20):
            copy.write(block)
            offset += len(block)
        copy.flush()
        os.fsync(copy.fileno())


def _link_new(handle: _Output | None, named: Path | None, path: Path) -> None:
    try:
        if named is not None:
            os.link(named, path)
            return
        try:
            _link_unnamed(handle, path)
        except OSError as error:
            if error.errno not in _NO_PROC_LINK:
                raise
            named = _temporary_name(path.parent)
            try:
                _copy_to(handle, named)
                os.link(named, path)
            finally:
                _unlink(named)
    except FileExistsError:
        raise UsageError(f"{path} appeared while it was being written; pass --force to overwrite it") from None


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _remove_stale_temporaries(folder: Path) -> None:
    """Remove temporaries of this package whose writing process no longer runs (killed mid-write)."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        found = _TEMPORARY.fullmatch(entry.name)
        if found is None or _running(int(found[1])):
            continue
        _unlink(Path(entry.path))


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


@contextmanager
def _signals_remove(temporary: Path | None) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def remove_and_exit(number, _frame) -> None:
        for worker in multiprocessing.active_children():
            worker.kill()
        if temporary is not None:
            _unlink(temporary)
        name = "interrupted" if number == signal.SIGINT else "terminated"
        try:
            os.write(sys.stderr.fileno(), f"csa-conform: error: {name}; nothing written\n".encode())
        except (OSError, ValueError):
            pass
        os._exit(128 + number)

    previous = {number: signal.signal(number, remove_and_exit) for number in SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
