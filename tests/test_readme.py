"""The README's set-up and console commands work as documented (Polygraphy's habit).

Set-up is two Makefile targets, `make demo` and `make test`, which build the
venv whose activation the README then asks for. After it every
`$ csa-conform ...` line runs as typed: the `csa-conform` script next to this
interpreter, importing this tree, in a scratch folder holding a copy of
goldens/ci.h5. Each must exit 0; `diff` needs a GPU, so there it runs with
every stage forced to the host, the control that must diff clean anywhere.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
COMMANDS = [line.split("  #")[0].strip() for line in re.findall(r"^\$ (csa-conform .+)$", README, flags=re.MULTILINE)]
SETUP = README[README.index("## Set-up"):README.index("\n## ", README.index("## Set-up") + 1)]


def dry_run(target: str) -> list[str]:
    """The commands `make TARGET` would run on a fresh clone (-B: as if nothing were built)."""
    outer = ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")  # set when the suite itself runs under `make test`
    env = {key: value for key, value in os.environ.items() if key not in outer}
    done = subprocess.run(["make", "--no-print-directory", "-n", "-B", target], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


def test_setup_is_two_makefile_targets():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.MULTILINE))
    setup = re.findall(r"^\$ make (\w+)", README, flags=re.MULTILINE)
    assert setup == ["demo", "test"] and set(setup) <= targets


@pytest.mark.parametrize("target", ["demo", "test"])
def test_setup_builds_the_venv_the_readme_activates(target):
    assert "$ . .venv/bin/activate" in SETUP
    commands = dry_run(target)
    assert commands[0].endswith("-m venv .venv")
    assert any(".venv/bin/pip install" in command and "-e '.[dev]'" in command for command in commands)
    tools = [command for command in commands if "csa-conform " in command or "pytest" in command]
    assert tools and all(command.startswith((".venv/bin/csa-conform ", ".venv/bin/python -m pytest"))
                         for command in tools)


def test_ci_runs_make_test():
    lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.strip()]
    assert lines[-1] == "make test"


@pytest.fixture
def scratch(tmp_path) -> Path:
    (tmp_path / "goldens").mkdir()
    shutil.copy(ROOT / "goldens" / "ci.h5", tmp_path / "goldens" / "ci.h5")
    return tmp_path


@pytest.fixture
def activated() -> dict[str, str]:
    """The environment after `. .venv/bin/activate`: this interpreter's scripts first on PATH."""
    scripts = Path(sys.executable).parent
    assert (scripts / "csa-conform").is_file(), f"{scripts} has no csa-conform script: install the package"
    return {**os.environ, "PATH": f"{scripts}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": str(ROOT)}


def test_readme_commands_run_in_order(scratch, activated):
    """One test, not one per line: later commands read what earlier ones wrote, as a reader's would."""
    assert COMMANDS
    for command in COMMANDS:
        if command.startswith("csa-conform diff"):
            command = re.sub(r"--mode \w+", "--force-host all", command)
        done = subprocess.run(command, shell=True, cwd=scratch, env=activated, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, f"$ {command}\n{done.stderr[-2000:]}"
