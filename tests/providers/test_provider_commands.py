"""Every command that runs kernels runs a Python provider too: bisect, explain, reduce, fuzz, gap, bench."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
from click.testing import CliRunner

from csa_conform.check.results import schema
from csa_conform.cli import main
from csa_conform.exitcodes import ExitCode

ROOT = Path(__file__).resolve().parents[2]
CI = str(ROOT / "goldens" / "ci.h5")
NUMPY = f"python:{ROOT / 'examples' / 'providers' / 'numpy_oracle.py'}:NumpyOracle"
PLANTED = f"python:{Path(__file__).with_name('planted.py')}:ScoresOneUlpHigh"
CASE = "random.r4-n4-i3-k1"


def invoke(*args):
    return CliRunner().invoke(main, [str(arg) for arg in args])


def test_bisect_names_the_stage_and_the_provider():
    result = invoke("bisect", CI, "--case", CASE, "--kernels", PLANTED)
    assert result.exit_code == ExitCode.DIVERGED, result.output
    assert "first divergence at step 0 of 1, stage index_scoring" in result.output
    assert f"the divergence originates in index_scoring [{PLANTED}]" in result.output


def test_explain_reads_the_observations_and_names_the_method():
    result = invoke("explain", CI, "--case", CASE, "--kernels", PLANTED, "--json")
    assert result.exit_code == ExitCode.DIVERGED, result.output
    document = json.loads(result.stdout)
    jsonschema.validate(document, schema())
    [explanation] = document["explain"]["explanations"]
    assert (explanation["stage"], explanation["kernel"]) == ("index_scoring", "planted-score.index_scoring")


def test_reduce_keeps_the_divergence_and_says_the_builtin_control_did_not_run(tmp_path):
    result = invoke("reduce", CI, "--case", CASE, "--kernels", PLANTED, "-o", tmp_path / "repro.h5", "-q")
    assert result.exit_code == ExitCode.DIVERGED, result.output
    assert "still diverges first at index_scoring/scores" in result.output
    assert "built-in kernels: not run (a python: provider on the CPU" in result.output


def test_fuzz_finds_the_planted_stage(tmp_path):
    result = invoke("fuzz", "--kernels", PLANTED, "--budget-s", "120", "--seed", "0", "-o", tmp_path / "found.h5")
    assert result.exit_code == ExitCode.DIVERGED, result.output
    assert "divergence at index_scoring/scores" in result.output


def test_gap_measures_a_provider_against_a_profile():
    result = invoke("gap", CI, "--case", CASE, "--profile", "reference", "--kernels", PLANTED, "--json")
    assert result.exit_code == ExitCode.OK, result.output
    document = json.loads(result.stdout)
    jsonschema.validate(document, schema())
    rows = {(row["stage"], row["tensor"]): row for row in document["gap"]["tensors"]}
    assert rows[("index_scoring", "scores")]["ulp"]["max"] == 1
    assert rows[("compression_update", "logical_records")]["identical"] == rows[
        ("compression_update", "logical_records")]["elements"]


def test_gap_refuses_a_kernel_directory_and_the_reference_against_itself():
    assert invoke("gap", CI, "--kernels", str(ROOT / "kernels")).exit_code == ExitCode.USAGE
    assert invoke("gap", CI, "--profile", "reference").exit_code == ExitCode.USAGE


def test_bench_times_each_call_and_the_step_on_host_timers_and_says_so():
    result = invoke("bench", CI, "--case", CASE, "--kernels", NUMPY, "--time-cap", "0.05", "--json")
    assert result.exit_code == ExitCode.OK, result.output
    document = json.loads(result.stdout)
    jsonschema.validate(document, schema())
    section = document["bench"]
    assert section["timer"] == "host-perf-counter" and section["caveat"].startswith("host timings")
    rows = section["cases"][0]["rows"]
    assert [row["row"] for row in rows] == [f"numpy-oracle.{stage}" for stage in (
        "compression_update", "index_key_update", "index_query_finalize", "index_scoring", "selection",
        "candidate_assembly", "sparse_sink_softmax_attention", "writeback")] + ["step"]
    assert all(row["status"] == "timed" and row["samples"] >= 1 for row in rows)


def test_bench_times_no_call_whose_stage_diverged():
    result = invoke("bench", CI, "--case", CASE, "--kernels", PLANTED, "--time-cap", "0.05", "--json")
    assert result.exit_code == ExitCode.DIVERGED, result.output
    rows = {row["row"]: row["status"] for row in json.loads(result.stdout)["bench"]["cases"][0]["rows"]}
    assert rows["planted-score.index_scoring"] == "not-timed" and rows["step"] == "not-timed"
    assert rows["planted-score.selection"] == "timed"
    result = invoke("bench", CI, "--case", CASE, "--kernels", PLANTED, "--time-cap", "0.05", "--time-diverged", "--json")
    rows = {row["row"]: row["status"] for row in json.loads(result.stdout)["bench"]["cases"][0]["rows"]}
    assert rows["planted-score.index_scoring"] == "untrusted" and rows["step"] == "untrusted"


def test_bench_refuses_what_times_launches_in_one_line():
    for words in (["--build", "strict"], ["--backend", "host"], ["--mode", "hot"], ["--devices", "0"]):
        result = invoke("bench", CI, "--kernels", NUMPY, *words)
        assert result.exit_code == ExitCode.USAGE and "python: provider" in result.output, words


def test_report_names_the_provider(tmp_path):
    result = invoke("diff", CI, "--case", CASE, "--kernels", PLANTED, "--json")
    (tmp_path / "run.json").write_text(result.stdout, encoding="utf-8")
    assert invoke("report", tmp_path / "run.json", "--html", tmp_path / "run.html").exit_code == ExitCode.OK
    assert f"{PLANTED} (provider planted-score " in (tmp_path / "run.html").read_text(encoding="utf-8")
