"""Goldens are reproducible: regenerating the ci suite gives the committed file's datasets,
and any number of worker processes gives the same file, byte for byte."""

from __future__ import annotations

from pathlib import Path

import h5py
import pytest
from click.testing import CliRunner

from csa_conform.cli import main
from csa_conform.golden import array_sha256

CI = Path(__file__).resolve().parents[2] / "goldens" / "ci.h5"
# Provenance that legitimately differs between machines (not data).
MACHINE_ATTRS = {"created_by", "numpy_version"}


def contents(path: Path) -> dict[str, tuple]:
    """Every dataset's (dtype, shape, stored sha256, sha256 of its data) and every attribute."""
    found: dict[str, tuple] = {}
    with h5py.File(path, "r") as handle:
        found["/"] = tuple(sorted((k, str(v)) for k, v in handle.attrs.items() if k not in MACHINE_ATTRS))

        def visit(name, item):
            attrs = tuple(sorted((k, str(v)) for k, v in item.attrs.items()))
            if isinstance(item, h5py.Dataset):
                data = item[()]
                found[name] = (str(item.dtype), item.shape, attrs, array_sha256(data))
            else:
                found[name] = attrs

        handle.visititems(visit)
    return found


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory):
    folder = tmp_path_factory.mktemp("regenerated")
    files = {}
    for jobs in (1, 2):
        path = folder / f"ci-jobs{jobs}.h5"
        result = CliRunner().invoke(main, ["generate", "--suite", "ci", "-o", str(path), "--jobs", str(jobs)])
        assert result.exit_code == 0, result.output
        files[jobs] = path
    return files


def test_regenerated_ci_suite_matches_the_committed_goldens(regenerated):
    committed, fresh = contents(CI), contents(regenerated[1])
    assert committed.keys() == fresh.keys()
    different = [name for name in committed if committed[name] != fresh[name]]
    assert different == [], f"{len(different)} objects differ, first {different[:5]}"


def test_more_jobs_write_the_same_bytes(regenerated):
    assert regenerated[1].read_bytes() == regenerated[2].read_bytes()
