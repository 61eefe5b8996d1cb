"""A wheel installed into a fresh virtual environment runs the README's main job.

The wheel is built from a copy of the source tree (so no build output lands in
the checkout) and the commands run in an empty folder with no PYTHONPATH, so
every file they read must come from the installed package: the built-in
kernels and goldens/ci.h5 travel as package data. Needs PyPI for the build
backend and the runtime dependencies.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from csa_conform.oracle.engine import ENGINE_VARIABLE

ROOT = Path(__file__).resolve().parents[2]
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__",
                                    ".pytest_cache", ".hypothesis", "*.pyc")

pytestmark = pytest.mark.slow


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """bin/ of a fresh venv holding only the wheel and its dependencies (not even pip), and an environment
    without the checkout."""
    base = tmp_path_factory.mktemp("wheel")
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV", ENGINE_VARIABLE)}
    source = base / "source"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(base / "dist"), str(source)],
        base, env)
    (wheel,) = (base / "dist").glob("csa_conform-*.whl")
    # No pip of its own (ensurepip costs seconds): this pip installs into it.
    venv.create(base / "venv")
    bin_dir = base / "venv" / "bin"
    run([sys.executable, "-m", "pip", "--python", str(bin_dir / "python"), "install", "--quiet", str(wheel)], base, env)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return bin_dir, env


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("job")


def packaged(installed, workdir, expression: str) -> Path:
    bin_dir, env = installed
    done = run([str(bin_dir / "python"), "-c", f"from csa_conform._base import resources; print({expression})"],
               workdir, env)
    return Path(done.stdout.strip())


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_package_data_is_the_repositorys_kernels_and_goldens(installed, workdir):
    site = installed[0].parent / "lib"
    goldens = packaged(installed, workdir, "resources.ci_goldens()")
    kernels = packaged(installed, workdir, "resources.builtin_kernels()")
    assert site in goldens.parents and site in kernels.parents
    assert sha256(goldens) == sha256(ROOT / "goldens" / "ci.h5")
    shipped = {file.name: sha256(file) for file in kernels.iterdir()}
    assert shipped == {file.name: sha256(file) for file in (ROOT / "kernels").iterdir()}


def test_main_job_runs_from_the_wheel(installed, workdir):
    bin_dir, env = installed
    cli = str(bin_dir / "csa-conform")
    goldens = packaged(installed, workdir, "resources.ci_goldens()")

    verified = run([cli, "verify", str(goldens), "--json"], workdir, env)
    (workdir / "verify.json").write_text(verified.stdout)
    assert json.loads(verified.stdout)["summary"]["failed"] == 0

    run([cli, "generate", "--suite", "ci", "--case", "seed-closed-form.*", "-o", "ci.h5"], workdir, env)
    run([cli, "verify", "ci.h5"], workdir, env)

    diff_output = run([cli, "diff", "--force-host", "all", "--json"], workdir, env).stdout
    (workdir / "diff.json").write_text(diff_output)
    diffed = json.loads(diff_output)
    assert diffed["golden"]["path"] == str(goldens) and diffed["exit_code"] == 0 and diffed["control_run"]
    kernels = diffed["kernels"]["kernels"]
    assert kernels["builtin"] and Path(kernels["path"]) == goldens.parents[1] / "kernels"
    assert len(kernels["files"]) == 8

    run([cli, "bisect", "--case", "seed-closed-form.r4-prefill-8", "--force-host", "all"], workdir, env)

    summary = run([cli, "report", "verify.json", "diff.json", "--junit", "junit.xml", "--json", "summary.json"], workdir, env)
    assert summary.stdout.startswith("report: 2 runs, 400 cases, 0 failed")
    assert (workdir / "junit.xml").read_text().startswith("<?xml")


@pytest.mark.skipif(shutil.which("g++") is None, reason="the host backend needs g++")
def test_the_host_backend_runs_the_builtin_kernels_from_the_wheel(installed, workdir):
    """--backend host builds the shipped shim and wrappers (package data) with g++: no GPU, no checkout."""
    bin_dir, env = installed
    cli = str(bin_dir / "csa-conform")
    cases = ["--case", "seed-closed-form.*"]
    diffed = json.loads(run([cli, "diff", "--backend", "host", *cases, "--json"], workdir, env).stdout)
    assert diffed["exit_code"] == 0 and not diffed["control_run"]
    assert diffed["kernels"]["device"]["name"] == "host emulation (g++)"
    assert {launch["path"] for launch in diffed["kernels"]["launches"]} == {"nvrtc"}
    run([cli, "bisect", "--backend", "host", "--case", "seed-closed-form.r4-prefill-8"], workdir, env)
    explained = json.loads(run([cli, "explain", "--backend", "host", *cases, "--json"], workdir, env).stdout)
    assert explained["exit_code"] == 0 and explained["explain"]["explanations"] == []
