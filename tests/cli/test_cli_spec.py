"""specs/cli.md describes exactly the command tree: commands, options, exit codes and stage spellings."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from csa_conform.cli import main
from csa_conform.exitcodes import ExitCode
from csa_conform.spec import PIPELINE

SPEC = (Path(__file__).resolve().parents[2] / "specs" / "cli.md").read_text()


def sections() -> dict[str, str]:
    parts = re.split(r"^## `csa-conform (\w+)[^`]*`$", SPEC, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2]))


def documented_options(text: str) -> set[str]:
    """Flags named in the first cell of a section's option rows ('-o, --output FILE' gives -o and --output)."""
    cells = re.findall(r"^\| `([^`]+)` \|", text, flags=re.MULTILINE)
    return {flag for cell in cells for flag in re.findall(r"(?<![\w-])(-{1,2}[a-z][\w-]*)", cell)}


def test_every_command_has_a_section():
    assert set(sections()) == set(main.commands)


@pytest.mark.parametrize("name", sorted(main.commands))
def test_a_commands_options_are_its_sections_rows(name):
    command: click.Command = main.commands[name]
    actual = {flag for param in command.params if isinstance(param, click.Option) for flag in param.opts}
    assert documented_options(sections()[name]) == actual


def test_exit_codes_table_is_the_enum():
    rows = re.findall(r"^\| (\d+) \| (\w+) \|", SPEC, flags=re.MULTILINE)
    assert {(int(code), name) for code, name in rows} == {(int(code), code.name) for code in ExitCode}


def test_stage_table_is_the_registry():
    rows = re.findall(r"^\| (\d:[\w-]+) \| (\w+) \|$", SPEC, flags=re.MULTILINE)
    assert rows == [(stage.label, stage.name) for stage in PIPELINE]
