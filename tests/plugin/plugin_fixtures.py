"""Plugin-test helpers: a small golden file made by the oracle, the node ids it collects, and inner
pytest runs that load the plugin explicitly (autoload off, so the result does not depend on what
the venv has installed)."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

import csa_conform
from csa_conform.golden import write_goldens
from csa_conform.golden.recipes import suite_recipes
from csa_conform.oracle import run_step

TESTS = Path(__file__).resolve().parents[1]

GOLDEN_NAME = "goldens.h5"
# A one-step ratio-4 prefill (all eight stages), a three-step ratio-128 stream (four stages)
# and a rejected step (validation only), from the ci suite.
R4_ID = "boundaries.r4-prefill-5"
R128_ID = "boundaries.r128-resumed-119-chunks"
REJECTED_ID = "errors.topk-tie-zero-weights"
R4_STAGES = (
    "compression_update", "index_key_update", "index_query_finalize", "index_scoring",
    "selection", "candidate_assembly", "sparse_sink_softmax_attention", "writeback",
)
R128_STAGES = ("compression_update", "candidate_assembly", "sparse_sink_softmax_attention", "writeback")


def expected_ids(file: str = "goldens.h5") -> list[str]:
    ids = [f"{file}::{R128_ID}::{stage}[{side}]" for stage in R128_STAGES for side in ("oracle", "device")]
    ids += [f"{file}::{R4_ID}::{stage}[{side}]" for stage in R4_STAGES for side in ("oracle", "device")]
    return ids + [f"{file}::{REJECTED_ID}::validation[oracle]"]


def ci_cases(*case_ids: str):
    return [recipe.generate(run_step) for recipe in suite_recipes("ci") if recipe.case_id in case_ids]


def first_numba_compile() -> None:
    """Compile once with numba (where installed) before any inner run.

    An inner run is in-process: pytester then drops every module imported during it. numba imports
    its lowering and boxing modules at its first compile, into tables that outlive them, and refuses
    them when a later compile imports them again ("duplicate registration"). Kernels loaded from
    numba's disk cache compile nothing, so which test compiles first depends on the run's order.
    """
    if importlib.util.find_spec("numba") is not None:
        from numba import njit

        njit(lambda value: value + 1)(1)


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
            "from csa_conform.device.host import HostEmulationBackend\n\n\n"
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


@pytest.fixture(scope="session")
def plugin_goldens(tmp_path_factory):
    path = tmp_path_factory.mktemp("plugin-goldens") / GOLDEN_NAME
    write_goldens(path, ci_cases(R4_ID, R128_ID, REJECTED_ID))
    return path


@pytest.fixture
def inner(pytester, monkeypatch, plugin_goldens) -> InnerPytest:
    return InnerPytest(pytester, monkeypatch, plugin_goldens)
