"""`csa-conform mutate` end to end on the host backend, kept small (the replicate module's mutants, one case):
the verdict cache (a second run judges nothing), shards merged by `report --merged`, the --min-score exit codes,
--list, --since and a baseline that does not pass."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from csa_conform.check.archived import load_results
from csa_conform.cli import main
from csa_conform.device.host.emulation import GXX
from csa_conform.device.kernels import KernelDirectory
from csa_conform.exitcodes import ExitCode

pytestmark = pytest.mark.skipif(GXX is None, reason="the host backend needs g++")

SMALL = ("--backend", "host", "--files", "csa_ratio4_index_replicate.cu", "--operators",
         "index-offset,index-swap,statement", "--case", "random.r4-n4-i3-k1")


def invoke(*args: str):
    return CliRunner().invoke(main, ["mutate", *args])


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("mutate-cache")


@pytest.fixture(scope="module")
def first(cache) -> dict:
    result = invoke(*SMALL, "--cache-dir", str(cache), "--jobs", "2", "--json", "-q")
    assert result.exit_code == ExitCode.OK, result.output
    return load_results(result.stdout, "mutate")


def test_first_run_judges_every_mutant(first):
    section = first["mutate"]
    assert first["command"] == "mutate" and first["exit_code"] == 0
    assert section["judged_now"] == section["summary"]["mutants"] == len(section["mutants"]) >= 4
    verdicts = {mutant["id"].split(":")[3]: mutant["verdict"] for mutant in section["mutants"]}
    assert verdicts["statement"] == "killed"
    survivor = next(mutant for mutant in section["mutants"] if mutant["operator"] == "index-offset")
    # one batch row: the replicate's batch offset is 0, the mutant passes the case
    assert survivor["verdict"] == "survived" and survivor["after"].startswith("selected[element] = shared[(s)")
    killed = next(mutant for mutant in section["mutants"] if mutant["operator"] == "statement")
    assert killed["case"] == "random.r4-n4-i3-k1" and killed["stage"] == "selection"


def test_second_run_judges_nothing(first, cache):
    result = invoke(*SMALL, "--cache-dir", str(cache))
    assert result.exit_code == ExitCode.OK, result.output
    assert "nothing judged again: all" in result.stdout
    assert "SURVIVORS (1)" in result.stdout and "+ selected[element] = shared[(s) * topk_width + slot];" in result.stdout
    again = load_results(invoke(*SMALL, "--cache-dir", str(cache), "--json").stdout, "mutate")["mutate"]
    assert again["judged_now"] == 0 and again["workers_started"] == 0
    assert [m["verdict"] for m in again["mutants"]] == [m["verdict"] for m in first["mutate"]["mutants"]]


def test_shards_merge_into_the_unsharded_run(first, cache, tmp_path):
    paths = []
    for shard in ("1/2", "2/2"):
        result = invoke(*SMALL, "--cache-dir", str(cache), "--shard", shard, "--json")
        assert result.exit_code == ExitCode.OK, result.output
        paths.append(tmp_path / f"shard-{shard[0]}.json")
        paths[-1].write_text(result.stdout)
    merged = tmp_path / "merged.json"
    result = CliRunner().invoke(main, ["report", *map(str, paths), "--merged", str(merged), "--junit",
                                       str(tmp_path / "junit.xml"), "--html", str(tmp_path / "report.html")])
    assert result.exit_code == ExitCode.OK, result.output
    document = load_results(merged.read_text(), "merged")
    assert [m["id"] for m in document["mutate"]["mutants"]] == [m["id"] for m in first["mutate"]["mutants"]]
    summary = {key: value for key, value in document["mutate"]["summary"].items() if key != "cached"}
    assert summary == {key: value for key, value in first["mutate"]["summary"].items() if key != "cached"}
    assert document["mutate"]["summary"]["cached"] == summary["mutants"]  # the shards read the first run's verdicts
    assert "shard" not in document["options"]
    assert "Survivors (1)" in (tmp_path / "report.html").read_text()
    assert 'type="survived"' in (tmp_path / "junit.xml").read_text()


@pytest.mark.parametrize("minimum, code", [("0.5", ExitCode.OK), ("100%", ExitCode.DIVERGED), ("1.5", ExitCode.USAGE)])
def test_min_score_gates_the_exit_status(first, cache, minimum, code):
    result = invoke(*SMALL, "--cache-dir", str(cache), "--min-score", minimum)
    assert result.exit_code == code, result.output
    if code == ExitCode.DIVERGED:
        assert "min-score 100.0%: FAILED" in result.stdout


def test_list_and_since(tmp_path):
    kernels = tmp_path / "kernels"
    shutil.copytree(KernelDirectory().path, kernels)
    for command in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "k"]):
        subprocess.run(["git", "-C", str(kernels), *command], check=True, capture_output=True)
    listed = invoke("--kernels", str(kernels), "--list", "--since", "HEAD")
    assert listed.exit_code == ExitCode.OK and listed.stdout == ""
    unchanged = invoke("--kernels", str(kernels), "--backend", "host", "--since", "HEAD", "--min-score", "95%", "-q")
    assert unchanged.exit_code == ExitCode.OK, unchanged.output  # nothing to judge is nothing to gate
    assert "no mutant selected (no kernel file changed since HEAD)" in unchanged.stdout
    path = kernels / "csa_ratio4_main_compression.cu"
    path.write_text(path.read_text() + "\n")
    listed = invoke("--kernels", str(kernels), "--list", "--since", "HEAD")
    assert listed.exit_code == ExitCode.OK, listed.output
    files = {line.split(":")[0] for line in listed.stdout.splitlines()}
    assert files == {"csa_ratio4_main_compression.cu"}
    bad = invoke("--kernels", str(kernels), "--list", "--since", "no-such-ref")
    assert bad.exit_code == ExitCode.USAGE and "--since no-such-ref" in bad.stderr


def test_a_baseline_that_fails_is_refused(tmp_path):
    kernels = tmp_path / "kernels"
    shutil.copytree(KernelDirectory().path, kernels)
    path = kernels / "csa_ratio4_index_replicate.cu"
    path.write_text(path.read_text().replace("selected[element] = shared", "selected[element] = 1 + shared"))
    result = invoke("--kernels", str(kernels), "--build", "strict", *SMALL[:4], "--operators", "index-swap",
                    "--case", "random.r4-n4-i3-k1", "--no-cache", "-q")
    assert result.exit_code == ExitCode.USAGE, result.output
    assert "the unmutated kernels do not pass the golden cases" in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.slow  # the one end-to-end check that a survivor becomes a case that kills it: a 60 s fuzz search
def test_augment_turns_a_survivor_into_a_killing_case(tmp_path):
    pytest.importorskip("hypothesis", reason="--augment fuzzes: the fuzz extra")
    found = tmp_path / "found.h5"
    result = invoke(*SMALL[:4], "--operators", "index-offset", "--case", "random.r4-n4-i3-k1", "--no-cache", "-q",
                    "--augment", str(found), "--augment-budget", "60", "--seed", "1", "--json")
    assert result.exit_code == ExitCode.OK, result.output
    augment = load_results(result.stdout, "mutate")["mutate"]["augment"]
    (survivor,) = augment["survivors"]
    assert survivor["outcome"] == "killed" and survivor["divergence"] == "selection/selected_indices"
    assert augment["written"] == 1 and found.is_file()
    assert CliRunner().invoke(main, ["verify", str(found)]).exit_code == ExitCode.OK
    assert CliRunner().invoke(main, ["diff", str(found), "--backend", "host", "-q"]).exit_code == ExitCode.OK
    judged = invoke(str(found), *SMALL[:4], "--operators", "index-offset", "--no-cache", "--json", "-q")
    assert load_results(judged.stdout, "mutate")["mutate"]["summary"]["killed"] == 1
