"""The README's console commands run as documented (Polygraphy's habit).

Each `$ csa-conform ...` line runs in a scratch folder holding a copy of
goldens/ci.h5 and must exit 0; `diff` needs a GPU, so it runs there with every
stage forced to the host, the control that must diff clean anywhere. The
set-up commands must be Makefile targets.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
COMMANDS = [line.split("  #")[0].strip() for line in re.findall(r"^\$ (csa-conform .+)$", README, flags=re.MULTILINE)]


def test_setup_commands_are_makefile_targets():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.MULTILINE))
    setup = re.findall(r"^\$ make (\w+)", README, flags=re.MULTILINE)
    assert setup == ["demo", "test"] and set(setup) <= targets


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("readme")
    (folder / "goldens").mkdir()
    shutil.copy(ROOT / "goldens" / "ci.h5", folder / "goldens" / "ci.h5")
    return folder


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_runs(command, scratch):
    if command.startswith("csa-conform diff"):
        command = re.sub(r"--mode \w+", "--force-host all", command)
    shell = command.replace("csa-conform", f"{sys.executable} -m csa_conform", 1)
    done = subprocess.run(shell, shell=True, cwd=scratch, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
