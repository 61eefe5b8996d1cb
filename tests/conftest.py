"""Test-suite root: pytest's prepend import mode puts this folder on sys.path,
so shared helpers (reference_corpus) import by module name."""

from pathlib import Path

import pytest

from csa_conform.golden import GoldenFile

CI_GOLDENS = Path(__file__).resolve().parents[1] / "goldens" / "ci.h5"


@pytest.fixture(scope="session")
def ci_golden():
    """goldens/ci.h5 opened once per test process: opening checks every object header (about a
    second) and a case is indexed on its first read, so tests reading the ci suite share one handle."""
    with GoldenFile(CI_GOLDENS) as golden:
        yield golden
