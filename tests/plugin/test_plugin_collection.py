"""What `pytest --csa-goldens FILE` collects: one item per case, stage and side, selectable with -k
and --csa-case; bad options are one usage error; without --csa-goldens the plugin does nothing."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from plugin_fixtures import R4_ID, R128_ID, R128_STAGES, REJECTED_ID, expected_ids

from csa_conform.device.backend import BACKENDS as RUNNER_BACKENDS
from csa_conform.pytest_plugin.choices import BACKENDS, MODES
from csa_conform.spec import Mode

pytest_plugins = ("pytester",)

ROOT = Path(__file__).resolve().parents[2]

def collected(result: pytest.RunResult) -> list[str]:
    return [line for line in result.outlines if "::" in line]


def test_one_item_per_case_stage_and_side(inner):
    result = inner.run("--collect-only", "-q")
    assert result.ret == pytest.ExitCode.OK
    assert collected(result) == expected_ids()
    result.stdout.fnmatch_lines(["25 tests collected*"])


def test_header_records_file_kernels_build_and_mode(inner):
    result = inner.run("--collect-only", "--csa-build", "production", "--csa-mode", "isolated")
    result.stdout.fnmatch_lines(
        ["csa-conform: goldens goldens.h5 (3 cases), kernels built-in, build production, mode isolated"]
    )
    result = inner.run("--collect-only", "--csa-case", "boundaries.*", "--csa-kernels=.")
    result.stdout.fnmatch_lines(
        ["csa-conform: goldens goldens.h5 (2 cases matching boundaries.*), kernels ., build strict, mode chained"]
    )


@pytest.mark.parametrize(
    ("expression", "kept"),
    [
        ("selection", [f"goldens.h5::{R4_ID}::selection[oracle]", f"goldens.h5::{R4_ID}::selection[device]"]),
        ("r128 and oracle", [f"goldens.h5::{R128_ID}::{stage}[oracle]" for stage in R128_STAGES]),
        ("validation", [f"goldens.h5::{REJECTED_ID}::validation[oracle]"]),
    ],
)
def test_k_selects_by_case_stage_and_side(inner, expression, kept):
    result = inner.run("--collect-only", "-q", "-k", expression)
    assert collected(result) == kept


def test_case_glob_narrows_the_file(inner):
    result = inner.run("--collect-only", "-q", "--csa-case", "boundaries.*")
    assert collected(result) == [node for node in expected_ids() if REJECTED_ID not in node]


def test_marker_selects_only_the_golden_items_beside_a_project_test(inner):
    inner.pytester.makepyfile(test_project="def test_own():\n    pass\n")
    everything = inner.run("--collect-only", "-q")
    assert "test_project.py::test_own" in collected(everything)
    assert len(collected(everything)) == 26
    only = inner.run("--collect-only", "-q", "-m", "csa_conform")
    assert collected(only) == expected_ids()


def test_the_file_given_as_a_path_too_is_collected_once(inner):
    result = inner.plain("--csa-goldens", inner.goldens, inner.goldens, "--collect-only", "-q")
    assert collected(result) == expected_ids()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--csa-goldens", "missing.h5"], "ERROR: --csa-goldens: missing.h5: no such file"),
        (["--csa-goldens", "goldens.h5", "--csa-case", "nothing.*"],
         "ERROR: --csa-goldens: no case of goldens.h5 matches 'nothing.*'"),
        (["--csa-goldens", "goldens.h5", "--csa-kernels", "no-such-dir"],
         "ERROR: --csa-kernels: no-such-dir is neither a directory nor a python:MODULE:OBJECT provider"),
        (["--csa-kernels", "kernels"], "ERROR: --csa-kernels needs --csa-goldens FILE"),
        (["--csa-goldens", "goldens.h5", "--csa-build", "fast"],
         "*argument --csa-build: invalid choice: 'fast' (choose from 'strict', 'production')"),
        (["--csa-goldens", "goldens.h5", "--csa-mode", "fused"],
         "*argument --csa-mode: invalid choice: 'fused' (choose from 'chained', 'isolated')"),
    ],
)
def test_bad_options_are_one_usage_error(inner, args, message):
    result = inner.plain(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
    assert "Traceback" not in result.stderr.str()


def test_not_a_golden_file_is_a_usage_error(inner):
    inner.pytester.makefile(".h5", notgolden="plain text")
    result = inner.plain("--csa-goldens", "notgolden.h5")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --csa-goldens: notgolden.h5: not an HDF5 file*"])


def test_mode_choices_are_the_runner_modes():
    assert MODES == tuple(mode.value for mode in Mode)


def test_backend_choices_are_the_runner_backends():
    assert BACKENDS == RUNNER_BACKENDS


def test_the_entry_point_loads_the_plugin_and_without_goldens_it_costs_nothing(pytester, monkeypatch):
    """An installed distribution declaring pyproject's pytest11 entry point, autoloaded as pip installs it.

    Without --csa-goldens the plugin is registered but collects nothing and imports none of
    csa-conform's machinery (the golden store, the oracle, the device runner).
    """
    tomllib = pytest.importorskip("tomllib")
    entry_points = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["pytest11"]
    assert entry_points == {"csa_conform": "csa_conform.pytest_plugin"}
    site = pytester.mkdir("site")
    dist = site / "csa_conform_probe-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: csa-conform-probe\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text("[pytest11]\ncsa_conform = csa_conform.pytest_plugin\n")
    monkeypatch.setenv("PYTHONPATH", f"{site}:{ROOT}")
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    pytester.makepyfile(test_own=textwrap.dedent("""
        import sys

        def test_plugin_is_loaded_and_idle(pytestconfig):
            assert pytestconfig.pluginmanager.get_plugin("csa_conform") is not None
            assert pytestconfig.pluginmanager.get_plugin("csa-conform-goldens") is None
            heavy = ("csa_conform.golden", "csa_conform.oracle", "csa_conform.device", "h5py",
                     "csa_conform.pytest_plugin.session")
            assert [name for name in heavy if name in sys.modules] == []
    """))
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines(["1 passed*"])


def test_the_spec_lists_exactly_the_plugins_options(inner):
    spec = (ROOT / "specs" / "pytest-plugin.md").read_text()
    table = spec.split("## Options", 1)[1].split("\n## ", 1)[0]
    documented = re.findall(r"^\| `(--csa-[a-z-]+)", table, flags=re.MULTILINE)
    offered = re.findall(r"^\s+(--csa-[a-z-]+)", inner.plain("--help").stdout.str(), flags=re.MULTILINE)
    assert documented == offered == [
        "--csa-goldens", "--csa-kernels", "--csa-build", "--csa-mode", "--csa-backend", "--csa-case",
        "--csa-bench-baseline",
    ]
