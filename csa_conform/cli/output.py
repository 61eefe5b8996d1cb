"""The standard streams of a command, guarded so the exit status stays the verdict whatever happens to them.

A CI step pipes a document (`| tee`, `| head`, `| jq`) or redirects it to a
file on a disk that can fill up; a container can start a command with
stdout or stdin closed. None of that may turn a failing run into exit 0,
and none of it may leave a traceback. So for the whole run:

- a closed stdin, stdout or stderr is reopened on /dev/null first (stdout
  read-only, so writes to it fail and are noticed): otherwise the next file
  the command opens would get that descriptor and receive its output;
- stdout is written through ``GuardedOutput``, which never raises: the first
  failed write is recorded and what follows is dropped;
- at the end ``final_exit_code`` decides: a non-zero verdict stays what it
  is; a passing run whose output was lost exits 4 (ENVIRONMENT) with one line
  on stderr, except for a reader that went away (broken pipe, `| head`),
  which took what it wanted and leaves the verdict alone;
- when stdout is a regular file (`--json > run.json`), a failed write cuts
  the file back to where the run started writing, so no half document is
  left for a later `report` to trip over.
"""

from __future__ import annotations

import errno
import fcntl
import io
import os
import stat
import sys

from csa_conform.exitcodes import ExitCode

__all__ = ["GuardedOutput", "final_exit_code", "guard_streams", "say_error", "stdin_closed"]

_STDIN_CLOSED = False


def stdin_closed() -> bool:
    """True when the process started with no stdin (`report -` then refuses instead of reading /dev/null)."""
    return _STDIN_CLOSED


def _reopen_closed_descriptors() -> None:
    global _STDIN_CLOSED
    for descriptor, flags in ((0, os.O_RDONLY), (1, os.O_RDONLY), (2, os.O_WRONLY)):
        try:
            os.fstat(descriptor)
        except OSError:
            opened = os.open(os.devnull, flags)
            if opened != descriptor:
                os.dup2(opened, descriptor)
                os.close(opened)
            if descriptor == 0:
                _STDIN_CLOSED = True
    if sys.stdin is None:
        sys.stdin = open(0, "r", closefd=False)
    if sys.stderr is None:
        sys.stderr = open(2, "w", closefd=False)


class GuardedOutput(io.RawIOBase):
    """A byte sink in front of the real stdout that records its first failure instead of raising."""

    def __init__(self, target):
        super().__init__()
        self._target = target
        self.failure: OSError | None = None
        self._start = _regular_file_offset(target)
        self.is_process_stdout = sys.__stdout__ is not None and target is getattr(sys.__stdout__, "buffer", None)

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        try:
            return self._target.isatty()
        except (OSError, ValueError):
            return False

    def fileno(self) -> int:
        return self._target.fileno()

    def write(self, data) -> int:
        if self.failure is None:
            try:
                view = memoryview(bytes(data))
                while view:
                    # A raw stdout (python -u) may write less than it was given; the rest is retried.
                    count = self._target.write(view)
                    view = view[len(view) if count is None else count:]
                self._target.flush()
            except (OSError, ValueError) as error:
                self.failure = error if isinstance(error, OSError) else OSError(errno.EBADF, "stdout is closed")
                self._cut_back()
        return len(data)

    def _cut_back(self) -> None:
        if self._start is None:
            return
        try:
            os.ftruncate(self._target.fileno(), self._start)
        except OSError:
            pass


def _regular_file_offset(target) -> int | None:
    """Where the run starts writing when stdout is a regular file it may cut back (not one opened to append)."""
    try:
        descriptor = target.fileno()
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            return None
        if fcntl.fcntl(descriptor, fcntl.F_GETFL) & os.O_APPEND:
            return None
        return os.lseek(descriptor, 0, os.SEEK_CUR)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return None


def guard_streams() -> GuardedOutput:
    """Reopen closed standard descriptors and route sys.stdout through a GuardedOutput (returned)."""
    _reopen_closed_descriptors()
    closed = sys.stdout is None
    original = open(1, "w", closefd=False) if closed else sys.stdout
    target = getattr(original, "buffer", None)
    if target is None:
        target = _TextTarget(original)
    guarded = GuardedOutput(target)
    guarded.is_process_stdout = guarded.is_process_stdout or closed
    encoding = getattr(original, "encoding", None) or "utf-8"
    sys.stdout = io.TextIOWrapper(guarded, encoding=encoding, errors="backslashreplace", write_through=True)
    return guarded


class _TextTarget:
    """A text stream seen as bytes (a test runner's captured stdout has no buffer)."""

    def __init__(self, stream):
        self._stream = stream
        self._encoding = getattr(stream, "encoding", None) or "utf-8"

    def write(self, data: bytes) -> None:
        self._stream.write(data.decode(self._encoding, errors="replace"))

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()


def final_exit_code(code: int, guarded: GuardedOutput) -> tuple[int, str | None]:
    """The exit code once the output's fate is known, and the one error line to print (or None)."""
    failure = guarded.failure
    if failure is None:
        return code, None
    if guarded.is_process_stdout:
        _silence_stdout()
    if failure.errno == errno.EPIPE:
        return code, None
    reason = failure.strerror or type(failure).__name__
    line = f"cannot write to stdout ({reason}); the output is incomplete"
    if code != ExitCode.OK:
        return code, line
    return int(ExitCode.ENVIRONMENT), line


def _silence_stdout() -> None:
    """Point descriptor 1 at /dev/null so the interpreter's last flush at exit has nowhere to fail."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.close(null)
    except OSError:
        pass


def say_error(line: str) -> None:
    """One line on stderr; a stderr that cannot take it (closed, full) must not change the exit code."""
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass
