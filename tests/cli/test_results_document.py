"""One results document for verify, diff, bisect and explain; report turns any of them into valid JUnit."""

from __future__ import annotations

import hashlib
import json
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import jsonschema
import pytest
import xmlschema
from click.testing import CliRunner
from golden_edits import rewrite

from csa_conform import __version__
from csa_conform.check.results import RESULTS_VERSION, schema
from csa_conform.cli import main
from csa_conform.exitcodes import ExitCode
from csa_conform.golden import SCHEMA_VERSION

JUNIT_XSD = xmlschema.XMLSchema(str(Path(__file__).with_name("junit.xsd")))
SMALL = "*r4-prefill-8"
CLOSED_FORM_CASE = "seed-closed-form.r4-prefill-8"
NOTHING_EXPLAINED = {"summary": {"divergences": 0, "explained": 0, "ambiguous": 0, "inherited": 0, "unexplained": 0,
                                 "failed": 0, "structural": 0},
                     "device_libm": [], "explanations": []}


def invoke(*args, env=None):
    return CliRunner().invoke(main, [str(arg) for arg in args], env=env or {})


def document_of(result) -> dict:
    document = json.loads(result.stdout)
    jsonschema.validate(document, schema())
    return document


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("results") / "small.h5"
    assert invoke("generate", "--case", SMALL, "-o", path).exit_code == ExitCode.OK
    return path


@pytest.fixture
def tampered(small, tmp_path) -> Path:
    """A valid copy whose stored Y differs in one element (digests resealed, so only replay can tell)."""
    path = tmp_path / "tampered.h5"
    path.write_bytes(small.read_bytes())
    rewrite(path, f"cases/{CLOSED_FORM_CASE}/steps/0000/outputs/Y", lambda v: v.__setitem__((0, 1, 0, 3), 0.5))
    return path


def test_verify_and_all_host_diff_write_the_same_schema(small, monkeypatch):
    verify = document_of(invoke("verify", small, "--json"))
    diff = document_of(invoke("diff", small, "--force-host", "all", "--json"))
    for document, command in ((verify, "verify"), (diff, "diff")):
        assert document["version"] == RESULTS_VERSION and document["command"] == command
        assert document["tool"]["version"] == __version__
        assert document["golden"] == {
            "path": str(small), "sha256": hashlib.sha256(small.read_bytes()).hexdigest(), "schema_version": SCHEMA_VERSION,
        }
        assert document["argv"][:2] == ["csa-conform", command]
        assert [case["case"] for case in document["cases"]] == [
            "boundaries.r4-prefill-8", CLOSED_FORM_CASE,
        ]
        assert document["exit_code"] == ExitCode.OK and document["passed"]
    assert verify["control_run"] is None and verify["kernels"] is None
    assert diff["control_run"] is True
    assert {launch["path"] for launch in diff["kernels"]["launches"]} == {"host-oracle"}


def test_an_all_host_explain_writes_the_document_with_its_section(small):
    document = document_of(invoke("explain", small, "--force-host", "all", "--json"))
    assert document["command"] == "explain" and document["exit_code"] == ExitCode.OK and document["passed"]
    assert document["control_run"] is True and len(document["cases"]) == 2
    assert document["explain"] == NOTHING_EXPLAINED


def test_an_all_host_diff_stays_small(small):
    """One record per launch made the all-host document 610 KB for the CI suite; now a case is a few lines."""
    text = invoke("diff", small, "--force-host", "all", "--json").stdout
    document = json.loads(text)
    per_case = len(json.dumps(document["cases"], indent=2)) / len(document["cases"])
    assert per_case < 1000, per_case
    assert all(launch["count"] >= 1 for launch in document["kernels"]["launches"])
    assert len(document["kernels"]["launches"]) == 8  # one entry per host stage, not per case x step


def test_a_failure_is_typed_with_values_and_its_reproduce_command(tampered):
    document = document_of(invoke("verify", tampered, "--json"))
    assert document["exit_code"] == ExitCode.DIVERGED and not document["passed"]
    case = next(case for case in document["cases"] if not case["passed"])
    (step,) = case["steps"]
    stage = step["stages"][0]
    (tensor,) = stage["tensors"]
    # only the output was edited: the attention and writeback payloads still hold the oracle's Y
    assert [entry["stage"] for entry in step["stages"]] == ["outputs"]
    assert (step["step"], stage["stage"], tensor["tensor"], tensor["type"]) == (0, "outputs", "Y", "bit-mismatch")
    assert tensor["first"]["coords"] == "b=0 s=1 h=0 d=3" and tensor["first"]["expected"] == 0.5
    assert "expected 0.5 [0x3f000000], actual " in tensor["message"]
    assert stage["reproduce"] == f"csa-conform verify {tampered} --case {CLOSED_FORM_CASE}"


def test_report_turns_a_diff_document_into_valid_junit(small, tmp_path):
    """`report diff.json` used to exit 2 ('not a csa-conform results document')."""
    results = tmp_path / "diff.json"
    results.write_text(invoke("diff", small, "--force-host", "all", "--json").stdout)
    junit = tmp_path / "junit.xml"
    result = invoke("report", results, "--junit", junit)
    assert result.exit_code == ExitCode.OK, result.output
    JUNIT_XSD.validate(str(junit))
    suite = ElementTree.parse(junit).getroot().find("testsuite")
    assert suite.get("name") == f"csa-conform diff {small}" and suite.get("tests") == "2"
    assert all(float(case.get("time")) >= 0 for case in suite.iter("testcase"))


def test_merged_explain_shards_keep_their_section_and_the_schema(small, tmp_path):
    shards = []
    for index in (1, 2):
        shard = tmp_path / f"explain-{index}.json"
        shard.write_text(invoke("diff", small, "--force-host", "all", "--explain", "--shard", f"{index}/2",
                                "--json").stdout)
        shards.append(shard)
    merged = tmp_path / "merged.json"
    assert invoke("report", *shards, "--merged", merged, "-q").exit_code == ExitCode.OK
    document = json.loads(merged.read_text())
    jsonschema.validate(document, schema())
    assert document["explain"] == NOTHING_EXPLAINED


def test_report_merges_shards_into_one_suite_with_typed_failures(tampered, tmp_path):
    shards = []
    for index, pattern in enumerate(("boundaries.*", "seed-closed-form.*")):
        shard = tmp_path / f"shard-{index}.json"
        shard.write_text(invoke("verify", tampered, "--case", pattern, "--json").stdout)
        shards.append(shard)
    junit, summary = tmp_path / "junit.xml", tmp_path / "summary.json"
    assert invoke("report", *shards, "--junit", junit, "--json", summary).exit_code == ExitCode.OK
    JUNIT_XSD.validate(str(junit))
    root = ElementTree.parse(junit).getroot()
    (suite,) = root.findall("testsuite")
    assert (suite.get("tests"), suite.get("failures"), root.get("tests")) == ("2", "1", "2")
    failure = suite.find(f"testcase[@name='{CLOSED_FORM_CASE}']/failure")
    assert failure.get("type") == "bit-mismatch"
    assert failure.get("message").startswith("step 0 outputs/Y: 1/")
    assert "expected 0.5 [0x3f000000], actual " in failure.get("message")
    assert f"reproduce: csa-conform verify {tampered} --case {CLOSED_FORM_CASE}" in failure.text
    assert json.loads(summary.read_text())["summary"] == {"runs": 2, "cases": 2, "failed": 1, "errors": 0}


def test_errors_print_the_same_document_with_the_exit_code(tmp_path, small):
    missing = tmp_path / "absent.h5"
    for command in (["verify", missing], ["diff", missing], ["bisect", missing, "--case", "x"],
                    ["explain", missing]):
        result = invoke(*command, "--json")
        assert result.exit_code == ExitCode.USAGE
        document = document_of(result)
        assert document["exit_code"] == ExitCode.USAGE and document["cases"] == []
        assert "no such file" in document["error"]["message"]
        assert document["golden"] == {"path": str(missing), "sha256": None, "schema_version": None}
    usage = invoke("diff", small, "--stage", "nine", "--json")
    assert usage.exit_code == ExitCode.USAGE
    assert "is not a stage" in document_of(usage)["error"]["message"]


def test_report_records_a_failed_run_as_a_failing_test(tmp_path):
    results = tmp_path / "error.json"
    results.write_text(invoke("verify", tmp_path / "absent.h5", "--json").stdout)
    junit = tmp_path / "junit.xml"
    assert invoke("report", results, "--junit", junit).exit_code == ExitCode.OK
    JUNIT_XSD.validate(str(junit))
    failure = ElementTree.parse(junit).getroot().find("testsuite/testcase/failure")
    assert failure.get("type") == "error" and "no such file" in failure.get("message")


def test_report_refuses_a_newer_results_version_and_reads_older_ones(tmp_path):
    """Older documents (tests/cli/test_older_results.py) are migrated; a newer one may mean what this
    csa-conform cannot know."""
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps({"format": "csa-conform-results", "version": 3, "cases": []}))
    result = invoke("report", newer, "--junit", tmp_path / "j.xml")
    assert result.exit_code == ExitCode.USAGE and "results version 3 was written by a newer csa-conform" in result.stderr


@pytest.mark.parametrize("flags, code", [([], ExitCode.ENVIRONMENT), (["--git-bisect"], ExitCode.BISECT_SKIP)])
def test_no_device_prints_the_document_with_its_exit_code(small, monkeypatch, flags, code):
    monkeypatch.setitem(sys.modules, "cupy", None)  # a machine without CuPy
    result = invoke("diff", small, "--json", *flags, env={"ONNX_GENAI_CSA_FORCE_HOST": "0"})
    assert result.exit_code == code
    document = document_of(result)
    assert document["exit_code"] == code and document["error"]["type"] == "DeviceUnavailable"
    assert "CuPy is not importable" in document["error"]["message"]


def test_a_shard_written_before_the_structural_count_merges_with_one_that_has_it():
    from csa_conform.report.merge import _merge_explain

    old = {"summary": dict(NOTHING_EXPLAINED["summary"], divergences=2, unexplained=2), "explanations": []}
    del old["summary"]["structural"]
    new = {"summary": dict(NOTHING_EXPLAINED["summary"], divergences=1, unexplained=1, structural=1),
           "explanations": []}
    merged = _merge_explain([old, new])["explain"]["summary"]
    assert (merged["divergences"], merged["unexplained"], merged["structural"]) == (3, 3, 1)
