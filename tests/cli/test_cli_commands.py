"""The command line: exit codes, one-line errors, reproduce commands, JSON and CI artefacts."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import h5py
import numpy as np
import pytest
from click.testing import CliRunner
from golden_edits import reseal, rewrite

import csa_conform.cli.generate as generate_module
from csa_conform.cli import main
from csa_conform.exitcodes import ExitCode
from csa_conform.golden.recipes import FixtureError

CI = Path(__file__).resolve().parents[2] / "goldens" / "ci.h5"
SMALL = "*r4-prefill-8"  # one closed-form and one boundaries case: two fast ratio-4 steps
CLOSED_FORM_CASE = "seed-closed-form.r4-prefill-8"


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output
    return lines[0]


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "small.h5"
    result = invoke("generate", "--case", SMALL, "-o", str(path))
    assert result.exit_code == ExitCode.OK, result.output
    assert "wrote" in result.stdout and "2 cases" in result.stdout
    return path


@pytest.fixture
def copy(small, tmp_path) -> Path:
    path = tmp_path / "copy.h5"
    path.write_bytes(small.read_bytes())
    return path


def untimed(document):
    """A results document without its wall-clock times (the only part that may differ run to run)."""
    if isinstance(document, dict):
        return {key: untimed(value) for key, value in document.items() if key != "time_s"}
    if isinstance(document, list):
        return [untimed(value) for value in document]
    return document


@pytest.mark.parametrize("command", [[], ["generate"], ["verify"], ["diff"], ["bisect"], ["explain"], ["inspect"],
                                     ["report"]])
def test_every_command_has_help(command):
    result = invoke(*command, "--help")
    assert result.exit_code == 0 and "Usage:" in result.stdout


def test_verify_passes_a_good_file(small):
    result = invoke("verify", str(small))
    assert result.exit_code == ExitCode.OK, result.output
    assert result.stdout.strip().splitlines()[-1].startswith("verified: 2/2 cases passed")


def test_verify_names_the_diverging_tensor_and_the_reproduce_command(copy):
    rewrite(copy, f"cases/{CLOSED_FORM_CASE}/steps/0000/stages/index_scoring/scores", lambda v: v.__setitem__((0, 5, 0), 1.0))
    result = invoke("verify", str(copy))
    assert result.exit_code == ExitCode.DIVERGED
    failures = [line for line in result.stdout.splitlines() if line.startswith("FAIL ")]
    assert len(failures) == 1
    line = failures[0]
    assert f"FAIL {CLOSED_FORM_CASE} step 0 index_scoring/scores: 1/" in line
    assert "first at b=0 s=5 c=0" in line
    assert line.endswith(f"reproduce: csa-conform verify {copy} --case {CLOSED_FORM_CASE}")
    rerun = invoke("verify", str(copy), "--case", CLOSED_FORM_CASE)
    assert rerun.exit_code == ExitCode.DIVERGED
    assert [line for line in rerun.stdout.splitlines() if line.startswith("FAIL ")] == failures


def test_a_flipped_byte_fails_its_checksum_and_is_named(copy):
    name = f"/cases/{CLOSED_FORM_CASE}/steps/0000/outputs/Y"
    with h5py.File(copy, "r+") as handle:
        values = handle[name][()]
        values.view(np.uint8).reshape(-1)[11] ^= 0x01
        handle[name][...] = values
    result = invoke("verify", str(copy))
    assert result.exit_code == ExitCode.DIVERGED
    line = next(line for line in result.stdout.splitlines() if line.startswith("FAIL "))
    assert f"FAIL {CLOSED_FORM_CASE}: corrupt dataset /cases/{CLOSED_FORM_CASE}/steps/0000/" in line
    assert ": sha256 mismatch (stored " in line and name in line


def test_expect_error_must_match_exactly(tmp_path):
    path = tmp_path / "errors.h5"
    assert invoke("generate", "--case", "errors.attr-causal-0", "-o", str(path)).exit_code == 0
    assert invoke("verify", str(path)).exit_code == ExitCode.OK
    tampered = tmp_path / "tampered.h5"
    tampered.write_bytes(path.read_bytes())
    with h5py.File(tampered, "r+") as handle:
        step = handle["cases/errors.attr-causal-0/steps/0000"]
        step.attrs["expect_error"] = step.attrs["expect_error"] + "!"
    result = invoke("verify", str(tampered))
    assert result.exit_code == ExitCode.DIVERGED
    assert "corrupt case /cases/errors.attr-causal-0: case_sha256 mismatch" in result.stdout

    def exclaim(cases):
        cases["errors.attr-causal-0"].steps[0].expect_error += "!"

    reseal(path, exclaim)
    result = invoke("verify", str(path))
    assert result.exit_code == ExitCode.DIVERGED
    assert "expected rejection" in result.stdout and "causal must be 1, got 0" in result.stdout


def test_json_output_is_the_same_for_any_number_of_jobs(copy):
    rewrite(copy, f"cases/{CLOSED_FORM_CASE}/steps/0000/outputs/Y", lambda v: v.__setitem__((0, 1, 0, 3), 0.0))
    single = invoke("verify", str(copy), "--json", "--jobs", "1")
    double = invoke("verify", str(copy), "--json", "--jobs", "2")
    assert single.exit_code == double.exit_code == ExitCode.DIVERGED
    first, second = untimed(json.loads(single.stdout)), untimed(json.loads(double.stdout))
    first.pop("argv"), second.pop("argv")
    assert first == second
    stage = next(case for case in first["cases"] if not case["passed"])["steps"][0]["stages"][0]
    diff = stage["tensors"][0]
    assert (stage["stage"], diff["tensor"], diff["type"]) == ("outputs", "Y", "bit-mismatch")
    assert diff["first"]["coords"] == "b=0 s=1 h=0 d=3"


def test_report_writes_junit_and_json_artefacts(copy, tmp_path):
    rewrite(copy, f"cases/{CLOSED_FORM_CASE}/steps/0000/outputs/selected_indices", lambda v: v.__setitem__((0, 0, 4, 0), 7))
    results = tmp_path / "verify.json"
    results.write_text(invoke("verify", str(copy), "--json").stdout)
    junit, summary = tmp_path / "junit.xml", tmp_path / "summary.json"
    result = invoke("report", str(results), "--junit", str(junit), "--json", str(summary))
    assert result.exit_code == ExitCode.OK, result.output
    suite = ElementTree.parse(junit).getroot().find("testsuite")
    assert suite.get("tests") == "2" and suite.get("failures") == "1"
    failure = suite.find(f"testcase[@name='{CLOSED_FORM_CASE}']/failure")
    assert "outputs/selected_indices" in failure.get("message")
    assert f"--case {CLOSED_FORM_CASE}" in failure.text
    assert json.loads(summary.read_text())["summary"] == {"runs": 1, "cases": 2, "failed": 1, "errors": 0}


def test_report_refuses_documents_it_did_not_write(tmp_path):
    bogus = tmp_path / "bogus.json"
    bogus.write_text('{"hello": 1}')
    result = invoke("report", str(bogus), "--junit", str(tmp_path / "j.xml"))
    assert result.exit_code == ExitCode.USAGE
    assert "not a csa-conform results document" in one_error_line(result)


@pytest.mark.parametrize(
    "arguments",
    [
        ["verify"],
        ["verify", "--bogus", "x.h5"],
        ["generate", "--suite", "nope"],
        ["generate", "--jobs", "0"],
        ["generate", "--case", "no-such-case-*"],
        ["inspect", str(CI), "--step", "1"],
        ["inspect", str(CI), "no.such.case"],
        ["report", "-"],
        ["frobnicate"],
    ],
)
def test_bad_arguments_exit_2_with_one_line(arguments):
    result = invoke(*arguments)
    assert result.exit_code == ExitCode.USAGE
    assert one_error_line(result).startswith("csa-conform: error: ")


def test_missing_non_hdf5_and_foreign_hdf5_files_exit_2(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as handle:
        handle["x"] = [1]
    for path, message in [
        (tmp_path / "absent.h5", "no such file"),
        (text, "not an HDF5 file"),
        (other, "not a csa-conform golden file"),
    ]:
        for command in ("verify", "inspect"):
            result = invoke(command, str(path))
            assert result.exit_code == ExitCode.USAGE
            assert message in one_error_line(result)


def test_schema_version_mismatch_exits_2_with_the_reason(copy):
    with h5py.File(copy, "r+") as handle:
        handle.attrs["schema_version"] = 9
    result = invoke("verify", str(copy))
    assert result.exit_code == ExitCode.USAGE
    assert "schema_version 9 is not supported" in one_error_line(result)


def test_generate_refuses_to_overwrite_without_force(copy):
    before = copy.read_bytes()
    result = invoke("generate", "--case", SMALL, "-o", str(copy))
    assert result.exit_code == ExitCode.USAGE and "--force" in one_error_line(result)
    assert copy.read_bytes() == before
    assert invoke("generate", "--case", SMALL, "-o", str(copy), "--force").exit_code == ExitCode.OK


def test_ctrl_c_during_generate_leaves_no_file(tmp_path, monkeypatch):
    calls = []
    generate_case = generate_module.generate_case

    def interrupted(recipe, **options):
        calls.append(recipe.case_id)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return generate_case(recipe, **options)

    monkeypatch.setattr(generate_module, "generate_case", interrupted)
    result = invoke("generate", "--case", SMALL, "-o", str(tmp_path / "out.h5"))
    assert result.exit_code == 130
    assert result.stderr.strip().splitlines()[-1] == "csa-conform: error: interrupted"
    assert "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == []


def test_inspect_lists_cases_steps_and_tensors(small):
    listing = invoke("inspect", str(small))
    assert listing.exit_code == 0
    assert CLOSED_FORM_CASE in listing.stdout and "suite=ci" in listing.stdout
    case = json.loads(invoke("inspect", str(small), CLOSED_FORM_CASE, "--json").stdout)
    assert case["steps"][0]["T"] == 8 and case["steps"][0]["S"] == 8 and case["family"] == "seed-closed-form"
    step = json.loads(invoke("inspect", str(small), CLOSED_FORM_CASE, "--step", "0", "--stage", "outputs", "--decode", "--json").stdout)
    tensors = {entry["tensor"]: entry for entry in step["tensors"]}
    assert list(tensors)[0] == "outputs/Y"
    key = tensors["outputs/present_index_key"]
    assert key["decoded"]["format"] == "fp4_e2m1_block32" and len(key["decoded"]["scale_bytes"]) == 4
    record = tensors["outputs/present_compressed_kv"]["decoded"]
    assert record["format"] == "fp8_e4m3_block64" and len(record["scales"]) == 7
    assert len(tensors["outputs/Y"]["sha256"]) == 64


def test_inspect_shows_expected_errors(tmp_path):
    path = tmp_path / "errors.h5"
    invoke("generate", "--case", "errors.nonfinite-query", "-o", str(path))
    result = invoke("inspect", str(path), "errors.nonfinite-query", "--step", "0", "--stage", "inputs")
    assert result.exit_code == 0
    assert "expect_error: CompressedSparseAttention: query[" in result.stdout


def test_a_recipe_that_misbehaves_fails_generation_with_a_reproduce_command(tmp_path, monkeypatch):
    def misbehaving(recipe, **_options):
        raise FixtureError(f"{recipe.case_id} step 0: the oracle accepted a step meant to be rejected", recipe.case_id)

    monkeypatch.setattr(generate_module, "generate_case", misbehaving)
    result = invoke("generate", "--case", "errors.attr-causal-0", "-o", str(tmp_path / "out.h5"))
    assert result.exit_code == ExitCode.DIVERGED
    line = result.stderr.strip().splitlines()[-1]
    assert line.endswith("reproduce: csa-conform generate --suite ci --seed 0 --case errors.attr-causal-0 -o case.h5")
    assert list(tmp_path.iterdir()) == []
