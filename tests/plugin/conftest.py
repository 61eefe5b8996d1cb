"""Plugin-test fixtures: a small golden file made by the oracle, and inner pytest runs that load the
plugin explicitly (autoload off, so the result does not depend on what the venv has installed)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "device"))
sys.path.insert(0, str(TESTS / "kernels_mutants"))

import csa_conform  # noqa: E402
from csa_conform.fixtures import suite_recipes  # noqa: E402
from csa_conform.goldens import write_goldens  # noqa: E402
from csa_conform.oracle import run_step  # noqa: E402
from device_fixtures import cuda_device, emulation_backend, pick  # noqa: E402

__all__ = ["cuda_device", "emulation_backend"]

# A one-step ratio-4 prefill (all eight stages), a three-step ratio-128 stream (four stages)
# and a rejected step (validation only).
R4, R128, REJECTED = "boundaries.r4-prefill-5", "boundaries.r128-*", "errors.topk*"
GOLDEN_NAME = "goldens.h5"


def ci_cases(*patterns: str):
    recipes = {recipe.case_id: recipe for recipe in suite_recipes("ci")}
    return [recipes[pick(recipes, pattern)].generate(run_step) for pattern in patterns]


@pytest.fixture(scope="session")
def plugin_cases():
    return ci_cases(R4, R128, REJECTED)


@pytest.fixture(scope="session")
def plugin_goldens(tmp_path_factory, plugin_cases):
    path = tmp_path_factory.mktemp("plugin-goldens") / GOLDEN_NAME
    write_goldens(path, plugin_cases)
    return path


class InnerPytest:
    """pytest runs inside a pytester directory holding a copy of the golden file."""

    def __init__(self, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, goldens: Path):
        self.pytester = pytester
        shutil.copy(goldens, pytester.path / GOLDEN_NAME)
        self.goldens = GOLDEN_NAME
        package_root = Path(csa_conform.__file__).resolve().parents[1]
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(package_root), os.environ.get("PYTHONPATH", "")]))
        monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")

    def run(self, *args: str, goldens: str | None = None) -> pytest.RunResult:
        return self.plain("--csa-goldens", goldens or self.goldens, *args)

    def plain(self, *args: str) -> pytest.RunResult:
        """The plugin loaded (already imported by this process, hence not assertion-rewritten)."""
        return self.pytester.runpytest(
            "-p", "csa_conform.pytest_plugin", "-W", "ignore::pytest.PytestAssertRewriteWarning", *args
        )

    def emulate_device(self, backend) -> None:
        """A conftest answering the plugin's backend hook with the g++ host emulation (every process)."""
        self.pytester.makeconftest(
            "import sys\n"
            f"sys.path.insert(0, {str(TESTS / 'device')!r})\n"
            "from host_emulation import HostEmulationBackend\n\n\n"
            "def pytest_csa_conform_backend(config):\n"
            f"    return HostEmulationBackend({str(backend.build_dir)!r})\n"
        )

    def without_device(self, monkeypatch: pytest.MonkeyPatch) -> str:
        """This process has no CUDA device (whatever the machine has); returns the reason given."""
        import csa_conform.device.cuda as cuda
        from csa_conform.errors import DeviceUnavailable

        reason = "no CUDA device is visible (planted by the test)"

        def no_device():
            raise DeviceUnavailable(reason)

        monkeypatch.setattr(cuda, "CudaBackend", no_device)
        return reason


@pytest.fixture
def inner(pytester, monkeypatch, plugin_goldens) -> InnerPytest:
    return InnerPytest(pytester, monkeypatch, plugin_goldens)
