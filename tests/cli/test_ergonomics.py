"""What a new user meets first: stage spellings, --quiet, progress, untruncated ids, control runs, bisect skips."""

from __future__ import annotations

import io
import json
from pathlib import Path

import h5py
import numpy as np
import pytest
from click.testing import CliRunner
from rich.console import Console

import csa_conform.cli.common as common
from csa_conform._base.statuses import IDENTICAL
from csa_conform.check.model import CaseVerdict, StageVerdict, StepVerdict
from csa_conform.check.options import RunOptions
from csa_conform.cli import main
from csa_conform.cli.diff import render_rich
from csa_conform.device.plan import parse_force_host
from csa_conform.exitcodes import ExitCode
from csa_conform.spec import Mode

SMALL = "*r4-prefill-8"
CLOSED_FORM_CASE = "seed-closed-form.r4-prefill-8"


def invoke(*args, env=None):
    return CliRunner().invoke(main, [str(arg) for arg in args], env=env or {})


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ergonomics") / "small.h5"
    assert invoke("generate", "--case", SMALL, "-o", path).exit_code == ExitCode.OK
    return path


@pytest.mark.parametrize("command", sorted(main.commands))
def test_every_help_has_an_example(command):
    text = invoke(command, "--help").stdout
    assert "Examples:" in text and f"csa-conform {command}" in text.split("Examples:")[1]
    assert "Examples:" in invoke("--help").stdout


def test_stage_help_lists_every_spelling():
    text = " ".join(invoke("diff", "--help").stdout.split())
    for label, name in (("1:compress", "compression_update"), ("5:select", "selection"), ("8:writeback", "writeback")):
        assert f"{label} ({name})" in text


@pytest.mark.parametrize("spelling", ["selection", "select", "5", "5:select"])
def test_stage_accepts_name_short_name_and_number(small, spelling):
    result = invoke("diff", small, "--force-host", "all", "--stage", spelling, "--json")
    assert result.exit_code == ExitCode.OK, result.output
    document = json.loads(result.stdout)
    assert document["options"]["stages"] == ["selection"]
    assert all(list(case["verdicts"]) == ["selection"] for case in document["cases"])


def test_force_host_accepts_the_same_spellings():
    assert parse_force_host("1,5:select,attention,writeback") == {
        "compression_update", "selection", "sparse_sink_softmax_attention", "writeback",
    }


def test_quiet_verify_prints_the_summary_only(small):
    result = invoke("verify", small, "-q")
    assert result.exit_code == ExitCode.OK
    assert result.stdout.splitlines() == [f"verified: 2/2 cases passed (2 steps) in {small}"]
    assert result.stderr == ""


def test_quiet_diff_has_no_header_or_table(small):
    result = invoke("diff", small, "--force-host", "all", "-q")
    assert result.exit_code == ExitCode.OK
    assert result.stdout.splitlines() == [
        "2 cases, 2 steps compared, 0 oracle-rejected steps skipped: 2 conformant, 0 diverged"
    ]


def test_piped_runs_draw_no_progress(small, tmp_path):
    """A log gets results, not one line per case (piped `make demo` printed ~490 progress lines)."""
    generated = invoke("generate", "--case", SMALL, "-o", tmp_path / "again.h5")
    assert generated.stderr == "" and "2 cases, 2 steps" in generated.stdout
    assert invoke("verify", small).stderr == ""


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_drawn_on_a_terminal_unless_quiet(monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(common.sys, "stderr", terminal)
    assert list(common.progress(iter(range(3)), 3, "diff", str)) == [0, 1, 2]
    assert "diff" in terminal.getvalue()
    quiet = Terminal()
    monkeypatch.setattr(common.sys, "stderr", quiet)
    assert list(common.progress(iter(range(3)), 3, "diff", str, quiet=True)) == [0, 1, 2]
    assert quiet.getvalue() == ""


def test_a_narrow_terminal_never_cuts_a_case_id():
    case = "seed-closed-form.r4-stream-with-a-rather-long-descriptive-name-17"
    stages = ("compression_update", "candidate_assembly", "sparse_sink_softmax_attention", "writeback")
    report = CaseVerdict(case, ratio=128, step_count=1, steps=[StepVerdict(0, compared=True)],
                         stages={stage: StageVerdict(stage, "device", IDENTICAL) for stage in stages})
    out = io.StringIO()
    render_rich([report], stages, [], RunOptions(file="g.h5", mode=Mode.CHAINED, force_host=frozenset(), ulp=0),
                console=Console(file=out, width=60, color_system=None))
    assert case in out.getvalue()


@pytest.mark.parametrize("how", ["option", "seed switch"])
def test_an_all_host_run_says_loudly_that_no_kernel_ran(small, how):
    args, env = (["--force-host", "all"], {}) if how == "option" else ([], {"ONNX_GENAI_CSA_FORCE_HOST": "1"})
    result = invoke("diff", small, *args, env=env)
    assert result.exit_code == ExitCode.OK
    assert "CONTROL RUN: no kernel was launched" in result.stderr
    if how == "seed switch":
        assert "ONNX_GENAI_CSA_FORCE_HOST=1 (inherited)" in result.stderr
    assert json.loads(invoke("diff", small, *args, "--json", env=env).stdout)["control_run"] is True
    bisect = invoke("bisect", small, "--case", CLOSED_FORM_CASE, *args, env=env)
    assert bisect.exit_code == ExitCode.OK and "CONTROL RUN" in bisect.stderr
    explain = invoke("explain", small, *args, env=env)
    assert explain.exit_code == ExitCode.OK and "CONTROL RUN" in explain.stderr


def _other_schema(path: Path) -> Path:
    with h5py.File(path, "r+") as handle:
        handle.attrs["schema_version"] = 9
    return path


@pytest.mark.parametrize("golden", ["missing", "unreadable", "other schema"])
@pytest.mark.parametrize("command", [["diff", "--force-host", "all"], ["bisect", "--case", CLOSED_FORM_CASE],
                                     ["explain", "--force-host", "all"]])
def test_git_bisect_skips_a_commit_whose_goldens_cannot_be_read(small, tmp_path, golden, command):
    path = tmp_path / "goldens.h5"
    if golden == "unreadable":
        path.write_bytes(b"not an HDF5 file")
    elif golden == "other schema":
        path.write_bytes(small.read_bytes())
        _other_schema(path)
    name, *rest = command
    assert invoke(name, path, *rest).exit_code == ExitCode.USAGE
    skipped = invoke(name, path, *rest, "--git-bisect")
    assert skipped.exit_code == ExitCode.BISECT_SKIP
    assert len(skipped.stderr.strip().splitlines()) == 1


def test_a_corrupt_dataset_exits_1_from_every_command(small, tmp_path):
    path = tmp_path / "corrupt.h5"
    path.write_bytes(small.read_bytes())
    name = f"cases/{CLOSED_FORM_CASE}/steps/0000/inputs/query"
    with h5py.File(path, "r+") as handle:
        values = handle[name][()]
        values.view(np.uint8).reshape(-1)[3] ^= 0x10
        handle[name][...] = values
    assert invoke("verify", path).exit_code == ExitCode.DIVERGED
    assert invoke("inspect", path, CLOSED_FORM_CASE, "--step", "0", "--stage", "inputs").exit_code == ExitCode.DIVERGED
    result = invoke("diff", path, "--force-host", "all", "--case", CLOSED_FORM_CASE)
    assert result.exit_code == ExitCode.DIVERGED and "sha256" in result.stderr
    assert invoke("diff", path, "--force-host", "all", "--git-bisect").exit_code == ExitCode.BISECT_SKIP
