"""What every command shares: the error boundary, exit codes and terminal-aware output.

The boundary turns the failures a user can cause (bad arguments, a missing,
malformed or tampered file) into one line on stderr and the matching exit
code, never a traceback; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import signal
import sys
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Callable, Iterable, Iterator, TypeVar

import click
from rich.console import Console

from csa_conform.errors import (
    CsaConformError,
    DeviceUnavailable,
    GoldenIntegrityError,
    GoldenWriteError,
    WorkerCrashed,
)
from csa_conform.exitcodes import ExitCode

PROGRAM = "csa-conform"
# More worker processes than this many per core only cost memory and file handles.
JOBS_PER_CORE = 2

Item = TypeVar("Item")
Result = TypeVar("Result")


def fail(message: str, code: ExitCode | int = ExitCode.USAGE) -> None:
    """Print one error line on stderr and exit."""
    first = " ".join(str(message).split("\n"))
    click.echo(f"{PROGRAM}: error: {first}", err=True)
    sys.exit(int(code))


def exit_code_of(error: BaseException) -> ExitCode:
    if isinstance(error, (GoldenIntegrityError, GoldenWriteError, WorkerCrashed)):
        return error.exit_code
    if isinstance(error, DeviceUnavailable):
        return ExitCode.ENVIRONMENT
    return ExitCode.USAGE


def boundary(command: Callable) -> Callable:
    """Map csa-conform and OS errors to one stderr line and an ExitCode; return codes exit."""

    @functools.wraps(command)
    def run(*args, **kwargs):
        try:
            code = command(*args, **kwargs)
        except BrokenPipeError:
            # The reader went away (`... | head`): nothing left to say to it.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(int(ExitCode.OK))
        except (CsaConformError, OSError) as error:
            fail(str(error), exit_code_of(error))
        sys.exit(int(code if code is not None else ExitCode.OK))

    return run


class OneLineErrors(click.Group):
    """A click group whose usage errors are one line (and whose Ctrl-C is one line too)."""

    def main(self, args=None, prog_name=None, **extra):
        extra["standalone_mode"] = False
        try:
            code = super().main(args=args, prog_name=prog_name or PROGRAM, **extra)
        except click.UsageError as error:
            hint = f" (see '{error.ctx.command_path} --help')" if error.ctx else ""
            fail(f"{error.format_message()}{hint}")
        except click.ClickException as error:
            fail(error.format_message())
        except click.Abort:
            fail("interrupted", ExitCode.INTERRUPTED)
        sys.exit(int(code or 0))


def stdout_is_terminal() -> bool:
    return sys.stdout.isatty()


def console(stderr: bool = False) -> Console:
    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def emit_json(document) -> None:
    click.echo(json.dumps(document, indent=2, sort_keys=False))


def command_line() -> str:
    return " ".join([PROGRAM] + [shlex.quote(argument) for argument in sys.argv[1:]])


def capped_jobs(jobs: int) -> int:
    """``--jobs`` limited to JOBS_PER_CORE worker processes per core (with a note on stderr)."""
    cap = JOBS_PER_CORE * (os.cpu_count() or 1)
    if jobs > cap:
        click.echo(f"{PROGRAM}: note: --jobs {jobs} capped at {cap} ({JOBS_PER_CORE} per core)", err=True)
        return cap
    return jobs


def _worker_ignores_interrupts() -> None:
    """Ctrl-C reaches the whole process group; the parent alone answers it, once."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def fan_out(function: Callable[[Item], Result], items: list[Item], jobs: int) -> Iterator[Result]:
    """``function`` over ``items`` in order, on ``jobs`` processes when jobs > 1.

    Results come back in item order whatever the worker timing, which is what
    keeps ``--jobs N`` output identical to ``--jobs 1``.
    """
    if jobs <= 1 or len(items) <= 1:
        yield from map(function, items)
        return
    pool = ProcessPoolExecutor(max_workers=jobs, initializer=_worker_ignores_interrupts)
    try:
        yield from pool.map(function, items)
    except BrokenProcessPool:
        raise WorkerCrashed("a worker process died before finishing; rerun with --jobs 1 to see why") from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def progress(items: Iterable[Result], total: int, label: str, describe: Callable[[Result], str]):
    """Wrap an iterator with a rich progress bar on a terminal (stderr), else plain lines."""
    if sys.stderr.isatty():
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        columns = (
            TextColumn(label),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
        )
        with Progress(*columns, console=console(stderr=True), transient=True) as bar:
            task = bar.add_task("", total=total)
            for item in items:
                bar.update(task, advance=1, description=describe(item))
                yield item
        return
    for index, item in enumerate(items, 1):
        click.echo(f"{label} [{index}/{total}] {describe(item)}", err=True)
        yield item
