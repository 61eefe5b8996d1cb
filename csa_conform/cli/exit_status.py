"""The exit-status paragraph of every command's --help, generated from ExitCode so no copy can drift."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import click

from csa_conform.exitcodes import ExitCode

COMMON = {
    ExitCode.USAGE: "usage or invalid input",
    ExitCode.ENVIRONMENT: "environment (no device, an output that cannot be written)",
    ExitCode.INTERNAL: "internal error in csa-conform (its bug, not a verdict: please report it)",
    ExitCode.BISECT_SKIP: "with --git-bisect, where this commit cannot be judged",
    ExitCode.INTERRUPTED: "interrupted",
    ExitCode.TERMINATED: "terminated",
}


def exit_table(ok: str, diverged: str | None = None, bisect: bool = False,
               own: dict[ExitCode, str] | None = None) -> dict[ExitCode, str]:
    """The codes a command exits with and what each means there, in ExitCode order (``own``: codes only
    this command uses)."""
    meanings = {ExitCode.OK: ok, **({ExitCode.DIVERGED: diverged} if diverged else {}), **COMMON, **(own or {})}
    if not bisect:
        del meanings[ExitCode.BISECT_SKIP]
    return {code: meanings[code] for code in ExitCode if code in meanings}


def exit_paragraph(table: dict[ExitCode, str]) -> str:
    return "Exit status: " + ", ".join(f"{int(code)} {meaning}" for code, meaning in table.items()) + "."


def exits(ok: str, diverged: str | None = None, bisect: bool = False,
          own: dict[ExitCode, str] | None = None) -> Callable[[click.Command], click.Command]:
    """Put a command's exit table after the first paragraph of its help (and keep it for the help test)."""

    def attach(command: click.Command) -> click.Command:
        table = exit_table(ok, diverged, bisect, own)
        head, _, rest = inspect.cleandoc(command.help or "").partition("\n\n")
        command.help = "\n\n".join(part for part in (head, exit_paragraph(table), rest) if part)
        command.exit_table = table  # type: ignore[attr-defined]
        return command

    return attach
