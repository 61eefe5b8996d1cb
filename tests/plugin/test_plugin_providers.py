"""The plugin on a Python stage provider (--csa-kernels python:…): the same items, judged like kernels."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugin_fixtures import R4_ID, expected_ids
from test_plugin_outcomes import outcomes, statuses

pytest_plugins = ("pytester",)

ROOT = Path(__file__).resolve().parents[2]
NUMPY = f"python:{ROOT / 'examples' / 'providers' / 'numpy_oracle.py'}:NumpyOracle"
PLANTED = f"python:{ROOT / 'tests' / 'providers' / 'planted.py'}:ScoresOneUlpHigh"


def test_the_numpy_provider_passes_every_item_without_a_device(inner, monkeypatch):
    inner.without_device(monkeypatch)
    result = inner.run(f"--csa-kernels={NUMPY}")
    assert result.ret == pytest.ExitCode.OK
    assert statuses(result) == dict.fromkeys(expected_ids(), "passed")
    result.stdout.fnmatch_lines(["*a python: provider, mode chained*",
                                 "csa-conform: 12 device items ran on numpy-oracle * on cpu"])


def test_a_provider_that_changes_one_stage_fails_that_item(inner, monkeypatch):
    inner.without_device(monkeypatch)
    result = inner.run(f"--csa-kernels={PLANTED}", "--csa-mode", "isolated")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    failing = f"goldens.h5::{R4_ID}::index_scoring[device]"
    found = outcomes(result)
    assert {node for node, (outcome, _) in found.items() if outcome == "failed"} == {failing}
    assert found[failing][1].splitlines()[-1] == (
        f"  reproduce: csa-conform diff goldens.h5 --stage index_scoring --mode isolated --case {R4_ID} "
        f"--kernels {PLANTED}")
