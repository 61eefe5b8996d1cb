"""Every --help states the exit codes the generated table has, no more and no fewer (specs/cli.md)."""

import re

import pytest
from click.testing import CliRunner

from csa_conform.cli import main
from csa_conform.cli.exit_status import exit_paragraph
from csa_conform.exitcodes import ExitCode

COMMANDS = [main, *main.commands.values()]


def _help(command) -> str:
    words = [] if command is main else [command.name]
    result = CliRunner().invoke(main, [*words, "--help"], terminal_width=10_000)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("command", COMMANDS, ids=lambda command: command.name)
def test_help_lists_exactly_the_generated_exit_codes(command):
    text = " ".join(_help(command).split())
    paragraphs = re.findall(r"Exit (?:status|codes?):[^.]*\.", text)
    assert paragraphs == [" ".join(exit_paragraph(command.exit_table).split())]
    listed = [int(code) for code in re.findall(r"(?:: |, )(\d+) ", paragraphs[0])]
    assert listed == [int(code) for code in command.exit_table]
    assert set(listed) <= {int(code) for code in ExitCode}
    assert {ExitCode.USAGE, ExitCode.ENVIRONMENT, ExitCode.INTERRUPTED, ExitCode.TERMINATED} <= set(command.exit_table)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda command: command.name)
def test_bisect_skip_is_listed_where_git_bisect_is_an_option(command):
    has_option = any("--git-bisect" in getattr(param, "opts", ()) for param in command.params)
    assert (ExitCode.BISECT_SKIP in command.exit_table) == (has_option or command is main)
