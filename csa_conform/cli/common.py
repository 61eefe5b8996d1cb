"""What every command shares: the error boundary, exit codes and terminal-aware output.

The boundary turns the failures a user can cause (bad arguments, a missing,
malformed or tampered file, no device) into one line on stderr and the exit
code the error carries (csa_conform.errors.exit_code_of, --git-bisect
included), never a traceback; with --json the checking commands also print
the results document of the failed run. Anything else is a bug of csa-conform:
one line naming it as such ("internal error in csa-conform: ...; please
report it") and its own exit code (70), never the divergence code.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import signal
import sys
import threading
from typing import Callable, Iterable, Iterator, TypeVar

import click
from rich.console import Console

from csa_conform._base.memory import headroom as memory_headroom
from csa_conform._base.memory import human, shared_headroom
from csa_conform._base.pool import ordered_map, stop_workers
from csa_conform._base.scratch import remove_scratch
from csa_conform._base.terminal import one_line
from csa_conform.check.results import COMMANDS, error_document
from csa_conform.cli.output import final_exit_code, guard_streams, say_error
from csa_conform.errors import CsaConformError, InternalError, MemoryShortage, exit_code_of
from csa_conform.exitcodes import ExitCode
from csa_conform.oracle.compiled.parallel import share_cores

PROGRAM = "csa-conform"
# More worker processes than this many per core only cost memory and file handles.
JOBS_PER_CORE = 2
# What one --jobs worker is budgeted: a numba worker's address space peaks near 450 MB on the ci suite.
WORKER_BYTES = 512 << 20

Item = TypeVar("Item")
Result = TypeVar("Result")


def fail(message: str, code: ExitCode | int = ExitCode.USAGE) -> None:
    """Print one error line on stderr and exit."""
    say_error(f"{PROGRAM}: error: {one_line(str(message))}")
    sys.exit(int(code))


def memory_bound() -> str:
    """' under the <limit>' for the one line of an out-of-memory exit ('' when no limit is known)."""
    bound = memory_headroom()
    return f" under the {bound[1]}" if bound is not None else ""


def argv() -> list[str]:
    """The command line as typed (the group records it; a command invoked on its own rebuilds it)."""
    context = click.get_current_context(silent=True)
    root = context.find_root() if context else None
    if root is not None and isinstance(root.obj, dict) and "argv" in root.obj:
        return root.obj["argv"]
    return [PROGRAM] + sys.argv[1:]


def _error_exit(error: BaseException, command: str | None, as_json: bool, git_bisect: bool,
                file: str | None) -> None:
    code = exit_code_of(error, git_bisect=git_bisect)
    if as_json and command in COMMANDS:
        emit_json(error_document(command, argv(), error, code, file))
    fail(str(error), code)


def boundary(command: Callable) -> Callable:
    """Map csa-conform and OS errors to one stderr line and an ExitCode; return codes exit."""

    @functools.wraps(command)
    def run(*args, **kwargs):
        switches = _given(kwargs, "as_json"), _given(kwargs, "git_bisect"), kwargs.get("file")
        try:
            code = command(*args, **kwargs)
        except (MemoryError, RuntimeError) as error:
            # A thread whose stack cannot be mapped is memory too (ulimit -v): "can't start new thread".
            if isinstance(error, RuntimeError) and "can't start new thread" not in str(error):
                _error_exit(InternalError.of(error), click.get_current_context().info_name, *switches)
            shortage = MemoryShortage(f"out of memory{memory_bound()}; rerun with more memory (or fewer --jobs)")
            _error_exit(shortage, click.get_current_context().info_name, *switches)
        except (CsaConformError, OSError) as error:
            _error_exit(error, click.get_current_context().info_name, *switches)
        except (click.ClickException, click.Abort, KeyboardInterrupt):
            raise
        except Exception as error:  # noqa: BLE001 - a bug of csa-conform: its own exit code, never a verdict
            _error_exit(InternalError.of(error), click.get_current_context().info_name, *switches)
        sys.exit(int(code if code is not None else ExitCode.OK))

    return run


def _given(kwargs: dict, name: str) -> bool:
    """A command's flag, passed alone or inside one of its option groups (csa_conform.cli.options)."""
    if name in kwargs:
        return kwargs[name]
    return next((getattr(value, name) for value in kwargs.values()
                 if dataclasses.is_dataclass(value) and hasattr(value, name)), False)


class OneLineErrors(click.Group):
    """A click group whose usage errors are one line (and whose Ctrl-C is one line too)."""

    def main(self, args=None, prog_name=None, **extra):
        """Run a command with guarded streams (csa_conform.cli.output): the exit code is the verdict."""
        previous = sys.stdout
        guarded = guard_streams()
        main_thread = threading.current_thread() is threading.main_thread()
        terminate = signal.signal(signal.SIGTERM, _terminated) if main_thread else None
        try:
            self._run(args, prog_name, **extra)
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else (0 if done.code is None else ExitCode.USAGE)
        finally:
            sys.stdout.flush()
            sys.stdout = previous if previous is not None else sys.stdout
            if main_thread:
                signal.signal(signal.SIGTERM, terminate)
        code, line = final_exit_code(code, guarded)
        if line is not None:
            say_error(f"{PROGRAM}: error: {line}")
        sys.exit(int(code))

    def _run(self, args, prog_name, **extra):
        extra["standalone_mode"] = False
        words = list(sys.argv[1:] if args is None else args)
        extra["obj"] = {"argv": [PROGRAM] + words}
        try:
            code = super().main(args=words, prog_name=prog_name or PROGRAM, **extra)
        except click.UsageError as error:
            hint = f" (see '{error.ctx.command_path} --help')" if error.ctx else ""
            if "--json" in words and error.ctx is not None and error.ctx.info_name in COMMANDS:
                emit_json(error_document(error.ctx.info_name, [PROGRAM] + words, error, ExitCode.USAGE))
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


def print_table(out: Console, table) -> None:
    """Print a table whose unbreakable cells (case ids) fit: a narrower terminal wraps the lines
    rather than rich cutting the ids or squeezing columns away."""
    needed = out.measure(table, options=out.options.update_width(10**4)).minimum
    out.width = max(out.width, needed)
    out.print(table, crop=False)


def emit_json(document) -> None:
    """Standard JSON on stdout: a non-finite float (which JSON has no spelling for) is written as a string."""
    click.echo(json.dumps(_finite(document), indent=2, sort_keys=False, allow_nan=False))


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def capped_jobs(jobs: int) -> int:
    """``--jobs`` limited to JOBS_PER_CORE worker processes per core and to the workers the memory
    headroom (a cgroup limit, the machine's available memory) can hold at WORKER_BYTES each, with a
    note on stderr either way."""
    cap = JOBS_PER_CORE * (os.cpu_count() or 1)
    if jobs > cap:
        say_error(f"{PROGRAM}: note: --jobs {jobs} capped at {cap} ({JOBS_PER_CORE} per core)")
        jobs = cap
    bound = shared_headroom()
    if jobs > 1 and bound is not None and bound[0] < jobs * WORKER_BYTES:
        fitting = max(1, bound[0] // WORKER_BYTES)
        say_error(f"{PROGRAM}: note: --jobs {jobs} capped at {fitting}: each worker is budgeted {human(WORKER_BYTES)} "
                  f"and the {bound[1]} leaves {human(bound[0])}")
        jobs = fitting
    return jobs


def fan_out(function: Callable[[Item], Result], items: list[Item], jobs: int,
            weights: list[float] | None = None) -> Iterator[Result]:
    """``function`` over ``items`` in order, on ``jobs`` processes when jobs > 1 (csa_conform._base.pool);
    the oracle's threads in each worker get their share of the cores, not all of them. With ``weights``
    the heaviest items start first (prod's 3 cases on 2 workers)."""
    processes = min(jobs, len(items))
    if processes <= 1:
        yield from map(function, items)
        return
    yield from ordered_map(function, items, processes, weights, start=functools.partial(share_cores, processes),
                           crashed="a worker process died before finishing; rerun with --jobs 1 to see why")


def _terminated(_number, _frame) -> None:
    """SIGTERM outside a file write: workers stopped, scratch removed, one line, exit 143 (atomic_file has its
    own)."""
    stop_workers()
    remove_scratch()
    say_error(f"{PROGRAM}: error: terminated")
    os._exit(int(ExitCode.TERMINATED))


def progress(items: Iterable[Result], total: int, label: str, describe: Callable[[Result], str],
             quiet: bool = False):
    """Wrap an iterator with a rich progress bar on stderr when it is a terminal (and not --quiet).

    Piped or redirected, nothing is drawn: a log gets the results, not one line per case.
    """
    if quiet or not sys.stderr.isatty():
        yield from items
        return
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
