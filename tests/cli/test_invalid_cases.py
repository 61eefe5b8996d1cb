"""One invalid case of a golden file (an attribute outside int64, a tensor that cannot be read) is that
case's verdict, `invalid` with its one-line reason, never the whole file's: the other cases are judged
as usual, and the exit status is the worst verdict's (2 for an invalid case, 125 under --git-bisect)."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import pytest
from click.testing import CliRunner
from golden_edits import reseal

from csa_conform.cli import main
from csa_conform.exitcodes import ExitCode
from csa_conform.golden import GoldenFile, write_goldens

ROOT = Path(__file__).resolve().parents[2]
GOOD, BAD, REJECTED = "boundaries.r4-prefill-3", "boundaries.r4-prefill-4", "errors.attr-causal-0"
CASES = (GOOD, BAD, REJECTED)
INPUT = f"/cases/{BAD}/steps/0000/inputs/query"


def invoke(*args):
    return CliRunner().invoke(main, [str(arg) for arg in args])


@pytest.fixture(scope="module")
def three(tmp_path_factory) -> Path:
    """Three cases of the committed suite, sealed: one accepted, one more accepted, one rejected."""
    path = tmp_path_factory.mktemp("invalid") / "three.h5"
    with GoldenFile(ROOT / "goldens" / "ci.h5") as golden:
        write_goldens(path, [golden.read_case(case) for case in CASES],
                      provenance={"suite": "ci", "suite_seed": 0, "selection": ",".join(CASES)})
    return path


def out_of_int64(cases) -> None:
    cases[BAD].attrs = {**cases[BAD].attrs, "index_topk": 2**63}


def string_tensor(handle) -> None:
    del handle[INPUT]
    handle.create_dataset(INPUT, data="text")
    handle[INPUT].attrs["sha256"] = "0" * 64


@pytest.fixture(params=["attribute outside int64", "a tensor that cannot be read"])
def hostile(request, three, tmp_path) -> tuple[Path, str]:
    path = tmp_path / "hostile.h5"
    path.write_bytes(three.read_bytes())
    if request.param == "attribute outside int64":
        reseal(path, out_of_int64)
        return path, "is outside int64"
    with h5py.File(path, "r+") as handle:
        string_tensor(handle)
    return path, "golden tensors are numbers"


def judged(result, reason: str) -> dict:
    """The document of a run with one invalid case: N-1 ordinary verdicts, one `invalid`, exit 2."""
    assert result.exit_code == ExitCode.USAGE, result.output
    document = json.loads(result.stdout)
    assert document["exit_code"] == ExitCode.USAGE and not document["passed"]
    cases = {case["case"]: case for case in document["cases"]}
    assert list(cases) == sorted(CASES)
    assert cases[BAD]["failure"]["type"] == "invalid" and reason in cases[BAD]["failure"]["message"]
    assert "\n" not in cases[BAD]["failure"]["message"] and not cases[BAD]["passed"]
    assert cases[GOOD]["passed"] and cases[REJECTED]["passed"]
    assert document["summary"]["invalid"] == 1 and document["summary"]["failed"] == 1
    return cases


def test_verify_judges_the_other_cases(hostile):
    path, reason = hostile
    cases = judged(invoke("verify", path, "--json"), reason)
    assert cases[GOOD]["steps_compared"] == 1 and cases[REJECTED]["rejected_steps"] == [0]
    text = invoke("verify", path)
    assert text.exit_code == ExitCode.USAGE and text.stderr == ""
    invalid = [line for line in text.stdout.splitlines() if line.startswith("INVALID ")]
    assert len(invalid) == 1 and invalid[0].startswith(f"INVALID {BAD}: ") and reason in invalid[0]
    assert text.stdout.splitlines()[-1].startswith("FAILED: 2/3 cases passed, 1 invalid ")


def test_verify_on_workers_judges_the_other_cases(hostile):
    path, reason = hostile
    judged(invoke("verify", path, "--jobs", "2", "--json"), reason)


def test_diff_and_explain_judge_the_other_cases(hostile):
    path, reason = hostile
    for command in ("diff", "explain"):
        cases = judged(invoke(command, path, "--force-host", "all", "--json"), reason)
        assert set(cases[BAD]["verdicts"].values()) == {"invalid"}
        assert set(cases[GOOD]["verdicts"].values()) <= {"identical", "n/a"}
    text = invoke("diff", path, "--force-host", "all")
    assert text.exit_code == ExitCode.USAGE
    assert any(line.startswith(f"{BAD}: invalid: ") and reason in line for line in text.stdout.splitlines())
    assert any(line.endswith(": 2 conformant, 0 diverged, 1 invalid") for line in text.stdout.splitlines())
    bisect = invoke("diff", path, "--force-host", "all", "--git-bisect", "-q")
    assert bisect.exit_code == ExitCode.BISECT_SKIP


def test_gap_measures_the_other_cases(hostile):
    path, reason = hostile
    cases = judged(invoke("gap", path, "--json"), reason)
    assert cases[GOOD]["passed"]
    document = json.loads(invoke("gap", path, "--json").stdout)
    assert document["gap"]["steps"] == 2  # the good case's step and the rejected one's
    text = invoke("gap", path)
    assert text.exit_code == ExitCode.USAGE
    assert text.stdout.splitlines()[-1].startswith(f"{BAD}: invalid, not measured: ")


def test_calibrate_refuses_a_file_with_an_invalid_case(hostile, tmp_path):
    path, reason = hostile
    result = invoke("calibrate", path, "-o", tmp_path / "t.toml")
    assert result.exit_code == ExitCode.USAGE and not (tmp_path / "t.toml").exists()
    assert "1 invalid, the first" in result.stderr and reason in result.stderr
