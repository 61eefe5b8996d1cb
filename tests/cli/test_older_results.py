"""report reads every results document an earlier csa-conform wrote (tests/cli/older_results, real output of
the commits its README names) and renders it as text, JUnit, HTML and a merged summary, alone and beside
today's documents; it refuses only a newer version, saying so."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
import xmlschema
from click.testing import CliRunner

from csa_conform.check.archived import load_results
from csa_conform.cli import main
from csa_conform.exitcodes import ExitCode

OLDER = Path(__file__).with_name("older_results")
DOCUMENTS = sorted(path.name for path in OLDER.glob("*.json"))
JUNIT_XSD = xmlschema.XMLSchema(str(Path(__file__).with_name("junit.xsd")))
ROOT = Path(__file__).resolve().parents[2]


def invoke(*args):
    return CliRunner().invoke(main, [str(arg) for arg in args])


def written(document: Path) -> dict:
    return json.loads(document.read_text())


@pytest.mark.parametrize("name", DOCUMENTS)
def test_an_older_document_renders_as_text_junit_html_and_summary(name, tmp_path):
    source = OLDER / name
    original = written(source)
    if "shard" in name:  # a shard is reported with its run's other shard
        sources = sorted(OLDER.glob(name.replace("1-of-2", "*-of-2").replace("2-of-2", "*-of-2")))
    else:
        sources = [source]
    junit, html, summary = tmp_path / "junit.xml", tmp_path / "report.html", tmp_path / "summary.json"
    result = invoke("report", *sources, "--junit", junit, "--html", html, "--json", summary)
    assert result.exit_code == ExitCode.OK, result.output
    cases = sum(written(path)["summary"]["cases"] for path in sources)
    failed = sum(written(path)["summary"]["failed"] for path in sources)
    assert result.stdout == f"report: 1 runs, {cases} cases, {failed} failed\n"
    JUNIT_XSD.validate(str(junit))
    testcases = ElementTree.parse(junit).getroot().findall("testsuite/testcase")
    assert len(testcases) == cases and len([case for case in testcases if case.find("failure") is not None]) == failed
    first = original["cases"][0]
    assert (first.get("case") or first.get("case_id")) in html.read_text()
    assert json.loads(summary.read_text())["summary"]["cases"] == cases


def test_the_document_the_issue_saw_refused_has_its_explain_counts_filled():
    """34cb32f's explain summary predates the ambiguous and failed verdicts: each is the count of its
    explanations of that verdict, which that explain never gave."""
    document = load_results((OLDER / "34cb32f-diff-explain.json").read_text(), "34cb32f")
    summary = document["explain"]["summary"]
    assert (summary["ambiguous"], summary["failed"]) == (0, 0)
    verdicts = [explanation["verdict"] for explanation in document["explain"]["explanations"]]
    assert summary["divergences"] == len(verdicts) > 0


def test_a_document_from_before_build_profiles_names_its_one_build():
    document = load_results((OLDER / "f5975d9-diff-control.json").read_text(), "f5975d9")
    build = document["kernels"]["kernels"]["build"]
    original = written(OLDER / "f5975d9-diff-control.json")["kernels"]["nvrtc_options"]
    assert build["profile"] == "strict" and build["options"] == original and "not recorded" in build["origin"]
    assert "nvrtc_options" not in document["kernels"] and document["kernels"]["modules"] == {}


def test_a_version_1_document_is_rebuilt_with_its_failing_tensor_typed():
    document = load_results((OLDER / "18465ba-verify-v1.json").read_text(), "18465ba")
    assert document["version"] == 2 and document["exit_code"] == ExitCode.DIVERGED and not document["passed"]
    assert document["argv"][:2] == ["csa-conform", "verify"] and document["golden"]["sha256"] is None
    (case,) = document["cases"]
    assert case["case"] == "random.r128-f32-b2n2" and case["steps_total"] == 3 and case["steps_compared"] == 3
    (step,) = case["steps"]
    tensors = [tensor for stage in step["stages"] for tensor in stage["tensors"]]
    assert {tensor["type"] for tensor in tensors} == {"bit-mismatch"}
    assert all("1/14336 elements differ (max 1 ulp); first at b=0 s=0 h=0 d=5" in tensor["message"]
               for tensor in tensors)


def test_a_bench_document_without_the_timer_fallback_reads_as_none():
    document = load_results((OLDER / "4903ba8-bench.json").read_text(), "4903ba8")
    assert document["bench"]["timer_fallback"] is None
    assert all(row["repetitions"] is None for case in document["bench"]["cases"] for row in case["rows"])


def test_older_shards_merge_into_the_document_this_csa_conform_writes(tmp_path):
    merged = tmp_path / "merged.json"
    shards = sorted(OLDER.glob("4903ba8-diff-shard-*.json"))
    assert invoke("report", *shards, "--merged", merged).exit_code == ExitCode.OK
    document = load_results(merged.read_text(), "merged")
    assert [case["case"] for case in document["cases"]] == ["random.r128-f32-b2n2", "random.r128-f32-b2n2-stale-row-1"]
    assert "shard" not in document["options"]


def test_an_older_shard_merges_with_a_shard_this_csa_conform_writes(tmp_path, monkeypatch):
    """Runners that upgrade at different times: 4903ba8's shard 1/2 and today's 2/2 of the same run."""
    monkeypatch.chdir(ROOT)
    today = tmp_path / "shard-2.json"
    run = invoke("diff", "tests/cli/older_results/r128-f32-b2n2.h5", "--backend", "host", "--case",
                 "random.r128-f32-b2n2*", "--shard", "2/2", "--json")
    assert run.exit_code == ExitCode.OK, run.output
    today.write_text(run.stdout)
    merged, html = tmp_path / "merged.json", tmp_path / "report.html"
    result = invoke("report", OLDER / "4903ba8-diff-shard-1-of-2.json", today, "--merged", merged, "--html", html)
    assert result.exit_code == ExitCode.OK, result.output
    assert result.stdout == "report: 1 runs, 2 cases, 0 failed\n"
    assert len(load_results(merged.read_text(), "merged")["cases"]) == 2


def test_older_documents_report_beside_todays(tmp_path):
    today = tmp_path / "verify.json"
    run = invoke("verify", ROOT / "goldens" / "ci.h5", "--case", "boundaries.r4-prefill-[18]", "--json")
    assert run.exit_code == ExitCode.OK, run.output
    today.write_text(run.stdout)
    older = [OLDER / "18465ba-verify-v1.json", OLDER / "34cb32f-diff-explain.json", OLDER / "4903ba8-verify.json"]
    junit, html, summary = tmp_path / "junit.xml", tmp_path / "report.html", tmp_path / "summary.json"
    result = invoke("report", *older, today, "--junit", junit, "--html", html, "--json", summary)
    assert result.exit_code == ExitCode.OK, result.output
    assert result.stdout == "report: 4 runs, 6 cases, 2 failed\n"
    JUNIT_XSD.validate(str(junit))
    runs = json.loads(summary.read_text())["runs"]
    assert [run["tool"]["version"] for run in runs][0] == "not recorded (results version 1)"
    assert "explain" in runs[1] and runs[3]["cases"] == written(today)["cases"]


def test_a_newer_version_is_refused_saying_so(tmp_path):
    newer = written(OLDER / "4903ba8-verify.json")
    newer["version"] = 3
    path = tmp_path / "newer.json"
    path.write_text(json.dumps(newer))
    result = invoke("report", path, "--junit", tmp_path / "junit.xml")
    assert result.exit_code == ExitCode.USAGE
    assert "results version 3 was written by a newer csa-conform; this one reads versions 1 to 2" in result.stderr
    assert not (tmp_path / "junit.xml").exists()
