"""One run of the runtime's conformance runner: ``CMD MODEL CASE_DIR``, bounded in time, its status read.

The runner prints one status line and exits with its code: ``OK\\t...`` (0),
``UNSUPPORTED_OP\\t...`` (2: no execution provider has the operator) or
``ERROR\\t...`` (3: the session refused or failed). Anything else (no status
line, a status its exit code contradicts, a signal, no answer within the
bound) is a runner that broke the protocol, said in one line. The runner
runs in its own process group, so a hang is ended with everything it started.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from csa_conform._base.terminal import one_line
from csa_conform.errors import UsageError

OK = "OK"
UNSUPPORTED = "UNSUPPORTED_OP"
ERROR = "ERROR"
STATUS_EXITS = {OK: 0, UNSUPPORTED: 2, ERROR: 3}
# What csa-conform itself concludes when the runner gave no valid status.
TIMEOUT = "TIMEOUT"
CRASHED = "CRASHED"
PROTOCOL = "PROTOCOL"
KEPT = 2000  # characters of a runner's stdout / stderr a record keeps
_LIVE: set[subprocess.Popen] = set()  # runners running now, so an interrupted run can end them
_LIVE_LOCK = threading.Lock()


def runner_words(template: str) -> list[str]:
    """The runner's command template as words; it must name ``{model}`` and ``{case_dir}``."""
    try:
        words = shlex.split(template)
    except ValueError as error:
        raise UsageError(f"--runner {template!r}: {error}") from None
    for placeholder in ("{model}", "{case_dir}"):
        if not any(placeholder in word for word in words):
            raise UsageError(f"--runner {template!r} names no {placeholder}: give 'CMD {{model}} {{case_dir}}'")
    return words


@dataclass
class RunnerRun:
    """What one runner process did: its verdict on the protocol, its line, its exit code and output."""

    status: str  # OK, UNSUPPORTED_OP, ERROR, or TIMEOUT / CRASHED / PROTOCOL
    message: str  # the status line's text after the tab, or what went wrong
    exit_code: int | None
    time_s: float
    stdout: str = ""
    stderr: str = ""

    @property
    def line(self) -> str:
        """One line saying what happened, for failure messages."""
        if self.status in STATUS_EXITS:
            return f"{self.status}\t{self.message}" if self.message else self.status
        return f"{self.status}: {self.message}"

    def to_dict(self) -> dict:
        return {"status": self.status, "message": self.message, "exit_code": self.exit_code,
                "time_s": round(self.time_s, 3), "stderr": self.stderr}


def _status(stdout: str, stderr: str) -> tuple[str, str] | None:
    """The status line: the last line of stdout (of stderr when stdout is empty) that starts with a status."""
    for text in (stdout, stderr):
        lines = [line for line in text.splitlines() if line.strip()]
        if lines:
            for line in reversed(lines):
                word, _, rest = line.partition("\t")
                if word in STATUS_EXITS:
                    return word, rest.strip()
            return None
    return None


def _tail(text: str) -> str:
    return one_line(text[-KEPT:].strip())


def run_runner(words: list[str], model: Path, case_dir: Path, environment: Mapping[str, str | None],
               timeout_s: float) -> RunnerRun:
    """Run the runner on one step's model and case directory and read its status; ``environment`` is
    added to this process's (a None value removes the variable)."""
    command = [word.replace("{model}", str(model)).replace("{case_dir}", str(case_dir)) for word in words]
    env = dict(os.environ)
    for key, value in environment.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    started = time.perf_counter()
    try:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   env=env, start_new_session=True)
    except OSError as error:
        return RunnerRun(PROTOCOL, f"cannot start {command[0]!r}: {error.strerror or error}", None, 0.0)
    with _LIVE_LOCK:
        _LIVE.add(process)
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        out, err = _ended(process)
        return RunnerRun(TIMEOUT, f"no status within {timeout_s:g} s; the runner was killed", None,
                         time.perf_counter() - started, _tail(out.decode(errors="replace")),
                         _tail(err.decode(errors="replace")))
    except BaseException:
        _ended(process)
        raise
    finally:
        _kill_group(process)  # whatever the runner left running in its group ends with it
        with _LIVE_LOCK:
            _LIVE.discard(process)
    elapsed = time.perf_counter() - started
    stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
    code = process.returncode
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return RunnerRun(CRASHED, f"the runner was killed by {name}", code, elapsed, _tail(stdout), _tail(stderr))
    found = _status(stdout, stderr)
    if found is None:
        return RunnerRun(PROTOCOL, f"exit code {code} with no status line (OK, UNSUPPORTED_OP or ERROR)", code,
                         elapsed, _tail(stdout), _tail(stderr))
    status, message = found
    if STATUS_EXITS[status] != code:
        return RunnerRun(PROTOCOL, f"status {status} with exit code {code} (the protocol's is {STATUS_EXITS[status]})",
                         code, elapsed, _tail(stdout), _tail(stderr))
    return RunnerRun(status, one_line(message), code, elapsed, _tail(stdout), _tail(stderr))


def _ended(process: subprocess.Popen) -> tuple[bytes, bytes]:
    """Kill the runner's group and collect what it wrote; a descendant that left the group and holds the
    pipes open is not waited for."""
    _kill_group(process)
    try:
        return process.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()
        process.wait()
        return b"", b""


def stop_runners() -> None:
    """Kill every runner still running (an interrupted or terminated bridge run)."""
    with _LIVE_LOCK:
        running = list(_LIVE)
    for process in running:
        _kill_group(process)


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
