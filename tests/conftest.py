"""Test-suite root: pytest's prepend import mode puts this folder on sys.path,
so shared helpers (reference_corpus) import by module name."""

from pathlib import Path

import pytest

from csa_conform.golden import GoldenFile

CI_GOLDENS = Path(__file__).resolve().parents[1] / "goldens" / "ci.h5"


@pytest.fixture(scope="module")
def ci_golden():
    """goldens/ci.h5 opened once per module: opening checks every object header (about a second) and
    a case is indexed on its first read, so a module's tests share one handle. Not once per session:
    each indexed case holds its datasets open, and HDF5 closes any file in time proportional to every
    object open in the process (0.1 s a close with all of ci indexed)."""
    with GoldenFile(CI_GOLDENS) as golden:
        yield golden
