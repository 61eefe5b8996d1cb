"""The README's commands work as typed and print what the README shows under them (Polygraphy's habit).

Set-up is Makefile targets (`make demo`, `make test`, `make check`, `make browser`), checked by a dry
run: running them is this suite itself. Every other `$ ` line of a console block runs, one test per
README section, in a scratch folder holding copies of goldens/, kernels/ and examples/: first the shell lines
of the sections before it (a reader's `cp` and `sed`), then the section's own lines in order (later
lines read what earlier ones wrote). `csa-conform ...` runs in this process through the command
line's entry point, so the libraries load once and each kernel directory is built with g++ once;
anything else through bash. One test runs a line through the installed `csa-conform` script on the
PATH the README's activation gives, so "as typed" holds of the script too. The fuzz section's
search is the one expensive command: it is marked `slow` (CI runs it).

A command must exit 0, or the code its `# exit N` comment names. Each line shown under it must be a
line of its output (stdout and stderr as a terminal interleaves them), in order: `...` stands for any
text (a line of its own for any lines) and a duration (`5.5 s`) for any duration; `bench` prints
timings, so in its lines every number stands for any number and `noisy` may come and go.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from csa_conform.cli import main
from csa_conform.device.host import GXX
from csa_conform.exitcodes import ExitCode

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
SETUP = README[README.index("## Set-up"):README.index("\n## ", README.index("## Set-up") + 1)]
ACTIVATE = ". .venv/bin/activate"
DURATION = re.compile(r"\d+(?:\.\d+)? s\b")
NUMBER = re.compile(r"\d+(?:\.\d+)?")


@dataclass(frozen=True)
class Line:
    """A `$ ` line of a console block: its section, the command, what the README shows under it, its exit
    code."""

    section: str
    command: str
    shown: tuple[str, ...]
    exit_code: int

    @property
    def runs_here(self) -> bool:
        """Not set-up: `make` targets and the activation are checked by dry runs."""
        return not self.command.startswith("make ") and self.command != ACTIVATE

    @property
    def is_cli(self) -> bool:
        return self.command.startswith("csa-conform ")


def console_lines() -> list[Line]:
    lines = []
    for section in re.split(r"^(?=#+ )", README, flags=re.MULTILINE):
        heading = section.split("\n", 1)[0].lstrip("# ")
        for block in re.findall(r"^```console\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL):
            for chunk in re.split(r"^\$ ", block, flags=re.MULTILINE)[1:]:
                first, *shown = chunk.rstrip("\n").split("\n")
                command, _, comment = first.partition("  #")
                code = re.search(r"\bexit (\d+)", comment)
                lines.append(Line(heading, command.strip(), tuple(shown), int(code.group(1)) if code else 0))
    return lines


LINES = console_lines()
RUN = [line for line in LINES if line.runs_here]
SECTIONS = list(dict.fromkeys(line.section for line in RUN))


def shown_pattern(shown: str, command: str) -> re.Pattern[str]:
    """A shown line as the pattern an output line must match in full."""
    timings = command.startswith("csa-conform bench")
    parts = []
    for piece in re.split(r"(\.\.\.|" + (NUMBER.pattern if timings else DURATION.pattern) + r"| noisy)", shown):
        if piece == "...":
            parts.append(".*")
        elif piece == " noisy" and timings:
            parts.append("(?: noisy)?")
        elif (NUMBER if timings else DURATION).fullmatch(piece):
            parts.append(NUMBER.pattern + ("" if timings else " s"))
        else:
            parts.append(re.escape(piece))
    return re.compile("".join(parts))


def assert_shows(line: Line, output: str) -> None:
    """Every shown line matches an output line, in order (a line of `...` skips any lines)."""
    printed = output.splitlines()
    at = 0
    for shown in line.shown:
        if shown == "...":
            continue
        pattern = shown_pattern(shown, line.command)
        while at < len(printed) and not pattern.fullmatch(printed[at]):
            at += 1
        assert at < len(printed), f"$ {line.command}\ndoes not print, in this order:\n{shown}\nit printed:\n{output}"
        at += 1


def run_in_process(line: Line) -> str:
    """Run a `csa-conform` line through the command line's entry point; a `> FILE` gets its stdout."""
    words = shlex.split(line.command)[1:]
    target = None
    if ">" in words:
        at = words.index(">")
        words, target = words[:at], words[at + 1]
    result = CliRunner().invoke(main, words, prog_name="csa-conform")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"$ {line.command}\n"
                             + "".join(traceback.format_exception(*result.exc_info)))  # type: ignore[misc]
    if target is not None:
        Path(target).write_text(result.stdout)
    assert result.exit_code == line.exit_code, f"$ {line.command}\nexit {result.exit_code}\n{result.output[-3000:]}"
    return result.stderr if target is not None else result.output


def run_in_bash(line: Line) -> str:
    done = subprocess.run(line.command, shell=True, executable="/bin/bash", capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == line.exit_code, f"$ {line.command}\nexit {done.returncode}\n{done.stderr[-2000:]}"
    return done.stdout + done.stderr


@pytest.fixture
def scratch(tmp_path, monkeypatch) -> Path:
    """A folder laid out as the repository root the README's commands run from."""
    (tmp_path / "goldens").mkdir()
    shutil.copy(ROOT / "goldens" / "ci.h5", tmp_path / "goldens" / "ci.h5")
    shutil.copytree(ROOT / "kernels", tmp_path / "kernels")
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def section_param(section: str):
    searches = any(line.command.startswith("csa-conform fuzz") for line in RUN if line.section == section)
    name = re.sub(r"\W+", "-", section.split(":")[0].lower())
    return pytest.param(section, id=name, marks=[pytest.mark.slow] if searches else [])


@pytest.mark.skipif(GXX is None, reason="the README's examples build the kernels with g++ (--backend host)")
@pytest.mark.parametrize("section", [section_param(section) for section in SECTIONS])
def test_readme_section_runs_and_prints_what_it_shows(section, scratch):
    before = RUN[:next(at for at, line in enumerate(RUN) if line.section == section)]
    for line in before:
        if not line.is_cli:
            run_in_bash(line)
    for line in (line for line in RUN if line.section == section):
        assert_shows(line, run_in_process(line) if line.is_cli else run_in_bash(line))


def test_the_activated_script_runs_as_typed(scratch):
    """An `inspect` line (it reads only the committed goldens) through the `csa-conform` script next to this
    interpreter, as a shell runs it."""
    scripts = Path(sys.executable).parent
    assert (scripts / "csa-conform").is_file(), f"{scripts} has no csa-conform script: install the package"
    line = next(line for line in RUN if line.command.startswith("csa-conform inspect "))
    environment = {**os.environ, "PATH": f"{scripts}{os.pathsep}{os.environ.get('PATH', '')}",
                   "PYTHONPATH": str(ROOT)}
    done = subprocess.run(line.command, shell=True, cwd=scratch, env=environment, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == line.exit_code, done.stderr[-2000:]
    assert_shows(line, done.stdout + done.stderr)


# --- what the shown output may stand for ----------------------------------------------------------

def test_a_shown_line_stands_for_durations_and_elisions_only():
    line = Line("", "csa-conform generate", ("wrote x.h5: 7 cases, 9 steps, 0.45 MB in 0.6 s", "a ... b"), 0)
    assert_shows(line, "wrote x.h5: 7 cases, 9 steps, 0.45 MB in 12 s\nzzz\na b c b\n")
    with pytest.raises(AssertionError):
        assert_shows(line, "wrote x.h5: 8 cases, 9 steps, 0.45 MB in 0.6 s\na b\n")
    with pytest.raises(AssertionError):
        assert_shows(line, "a b\nwrote x.h5: 7 cases, 9 steps, 0.45 MB in 0.6 s\n")
    timed = Line("", "csa-conform bench", ("row  median 0.4282 ms n=123 noisy  22.3%",), 0)
    assert_shows(timed, "row  median 1.5 ms n=40  9%\n")
    with pytest.raises(AssertionError):
        assert_shows(timed, "row  mean 1.5 ms n=40  9%\n")


# --- set-up -------------------------------------------------------------------------------------

def dry_run(target: str) -> list[str]:
    """The commands `make TARGET` would run on a fresh clone (-B: as if nothing were built)."""
    outer = ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")  # set when the suite itself runs under `make test`
    env = {key: value for key, value in os.environ.items() if key not in outer}
    done = subprocess.run(["make", "--no-print-directory", "-n", "-B", target], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


def test_setup_is_two_makefile_targets_and_the_others_exist():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.MULTILINE))
    first_block = re.search(r"```console\n(.*?)```", SETUP, flags=re.DOTALL).group(1)
    assert re.findall(r"^\$ make (\w+)", first_block, flags=re.MULTILINE) == ["demo", "test"]
    named = set(re.findall(r"^\$ make ([\w-]+)", README, flags=re.MULTILINE))
    named |= set(re.findall(r"`make ([\w-]+)", README))
    assert {"demo", "test", "check", "browser"} <= named <= targets


@pytest.mark.parametrize("target", ["demo", "test", "check"])
def test_setup_builds_the_venv_the_readme_activates(target):
    assert f"$ {ACTIVATE}" in SETUP
    commands = dry_run(target)
    assert commands[0].endswith("-m venv .venv")
    assert any(".venv/bin/pip install" in command and "-e '.[dev]'" in command for command in commands)
    tools = [command for command in commands if "csa-conform " in command or "pytest" in command]
    assert tools and all(command.startswith((".venv/bin/csa-conform ", ".venv/bin/python -m pytest"))
                         for command in tools)


def test_make_test_installs_nothing_and_ci_installs_the_browser_first():
    assert not any("apt-get" in command for command in dry_run("test"))
    assert any("apt-get install" in command for command in dry_run("browser"))
    lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert lines[-2:] == ["make browser", "make test"]


# --- the command and exit-code tables -------------------------------------------------------------

def table_rows(heading: str) -> list[list[str]]:
    """The rows (cells) of the first table after the README's `heading` line."""
    section = README[README.index(heading):]
    table = re.search(r"^\|.*?(?=\n[^|])", section, flags=re.MULTILINE | re.DOTALL).group(0)
    rows = [[cell.strip() for cell in row.strip("|").split(" | ")] for row in table.splitlines()]
    return rows[2:]


def test_the_exit_code_table_is_exactly_the_codes_of_the_code():
    section = README[README.index("The exit codes\n(`csa_conform.exitcodes.ExitCode`)"):]
    table = re.search(r"^\| code \|.*?(?=\n[^|])", section, flags=re.MULTILINE | re.DOTALL).group(0)
    codes = [int(row.split("|")[1]) for row in table.splitlines()[2:]]
    assert codes == [int(code) for code in ExitCode]


def test_the_command_table_names_every_command_and_exactly_its_exit_codes():
    every = re.search(r"Every command has ([\d, and]+)\.", README).group(1)
    common = {int(code) for code in re.findall(r"\d+", every)}
    rows = table_rows("## Commands and exit codes")
    listed = {}
    for command, _, codes in rows:
        name = re.match(r"`csa-conform (\w+)", command).group(1)
        listed[name] = common | {int(code) for code in re.findall(r"(?<![\w.-])(\d+)\b", codes)}
    assert listed.keys() == main.commands.keys()
    for name, command in main.commands.items():
        assert listed[name] == {int(code) for code in command.exit_table}, name
