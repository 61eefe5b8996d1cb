"""Process exit codes (specs/cli.md), used everywhere a command exits."""

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    DIVERGED = 1
    USAGE = 2
    ENVIRONMENT = 4
    INTERNAL = 70  # EX_SOFTWARE: csa-conform itself failed (a bug to report), never a verdict on the kernels
    BISECT_SKIP = 125
    INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C
    TERMINATED = 143  # 128 + SIGTERM
