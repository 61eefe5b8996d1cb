"""Test-suite root: pytest's prepend import mode puts this folder on sys.path,
so shared helpers (reference_corpus) import by module name."""

import os
from pathlib import Path

import pytest

from csa_conform.golden import GoldenFile

CI_GOLDENS = Path(__file__).resolve().parents[1] / "goldens" / "ci.h5"


@pytest.fixture(scope="module")
def ci_golden():
    """goldens/ci.h5 opened once per module: opening checks all 3,500 object headers (0.35 s of CPU)
    and a case is indexed on its first read (16 ms), so a module's tests share one handle. Not once per session:
    each indexed case holds its datasets open, and h5py walks every dataset handle alive in the process
    at each file close (6 ms a close with all of ci indexed)."""
    with GoldenFile(CI_GOLDENS) as golden:
        yield golden


@pytest.fixture(scope="session", autouse=True)
def host_builds(tmp_path_factory):
    """The one folder every in-process host build of the run goes to (the emulation fixtures' and
    `--backend host`'s, which would build in a folder per process): pytest-xdist's workers share it,
    their base folders being folders of the run's, so a module that both workers launch is built once."""
    from csa_conform.device.host import emulation

    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "host-builds"
    folder.mkdir(exist_ok=True)
    patch = pytest.MonkeyPatch()
    patch.setattr(emulation, "process_build_dir", lambda: folder)
    yield folder
    patch.undo()
