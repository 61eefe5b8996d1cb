"""The package says it is typed (py.typed ships in the wheel), so its public surface must type-check strictly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The modules a caller imports from: the package's own exports, the errors and exit codes they name, the
# pipeline spec, the run options and the device backend protocol a custom backend implements.
PUBLIC = ("csa_conform/__init__.py", "csa_conform/errors.py", "csa_conform/exitcodes.py", "csa_conform/spec",
          "csa_conform/check/options.py", "csa_conform/device/backend.py")


def test_py_typed_exists_and_is_package_data():
    assert (ROOT / "csa_conform" / "py.typed").is_file()
    package_data = (ROOT / "pyproject.toml").read_text().split("[tool.setuptools.package-data]", 1)[1]
    assert '"py.typed"' in package_data.split("\n[", 1)[0]


def test_the_public_surface_passes_mypy_strict():
    pytest.importorskip("mypy", reason="mypy is in the dev extra")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--ignore-missing-imports",
         "--no-incremental", *PUBLIC],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
