"""Process exit codes (specs/cli.md), used everywhere a command exits."""

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    DIVERGED = 1
    USAGE = 2
    SLOW = 3  # bench only: a row of the new kernels is slower than the baseline
    ENVIRONMENT = 4
    INTERNAL = 70  # EX_SOFTWARE: csa-conform itself failed (a bug to report), never a verdict on the kernels
    BISECT_SKIP = 125
    INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C
    TERMINATED = 143  # 128 + SIGTERM


def verdicts_code(failed: bool, invalid: bool) -> ExitCode:
    """A run's exit code from its cases' verdicts, the worst one winning: an invalid case (USAGE, as an
    unreadable file is) over a failing one (DIVERGED) over none (OK)."""
    return ExitCode.USAGE if invalid else ExitCode.DIVERGED if failed else ExitCode.OK
