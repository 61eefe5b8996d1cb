"""`csa-conform bridge` against runners that break the protocol: each fault has its one-line verdict and
exit code, nothing outlives its bound, and nothing is left in the temporary folder."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from csa_conform.check.results import schema
from csa_conform.cli import main
from csa_conform.exitcodes import ExitCode

CI = Path(__file__).resolve().parents[2] / "goldens" / "ci.h5"
FAKE = Path(__file__).with_name("fake_runner.py")
CASE = "seed-closed-form.r4-prefill-8"  # one accepted ratio-4 step: six outputs, Y first
REJECTED = "errors.attr-num-heads-float"  # one step the reference rejects


def bridge(mode: str, *extra: str, case: str = CASE, tmp_path: Path, env: dict | None = None):
    """The bridge on one case with a fake runner; its temporary folder under tmp_path/tmp, checked empty after."""
    work = tmp_path / "tmp"
    work.mkdir(exist_ok=True)
    result = CliRunner().invoke(
        main, ["bridge", str(CI), "--case", case, "--runner", f"{sys.executable} {FAKE} {mode} {{model}} {{case_dir}}",
               "--force-host-env", "", *extra], env={"TMPDIR": str(work), **(env or {})})
    assert "Traceback" not in result.output, result.output
    assert list(work.iterdir()) == [], "the bridge left files behind"
    return result


def gone(pid: int) -> bool:
    """No such process, or only its zombie (a container's init may not reap the runner's orphans)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


def document(result) -> dict:
    found = json.loads(result.stdout)
    jsonschema.validate(found, schema())
    return found


def failure_lines(result) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.startswith("FAIL ")]


def test_a_conformant_runner_passes_and_its_status_is_recorded(tmp_path):
    result = bridge("echo", "--json", tmp_path=tmp_path)
    assert result.exit_code == ExitCode.OK, result.output
    found = document(result)
    assert found["command"] == "bridge" and found["passed"]
    (status,) = found["bridge"]["statuses"]
    assert (status["case"], status["step"], status["run"], status["status"], status["message"]) == (
        CASE, 0, "plain", "OK", "6 outputs")
    assert found["bridge"]["runner"].endswith("echo {model} {case_dir}")


def test_a_wrong_output_element_is_a_bit_mismatch(tmp_path):
    result = bridge("wrong", tmp_path=tmp_path)
    assert result.exit_code == ExitCode.DIVERGED
    (line,) = failure_lines(result)
    assert f"FAIL {CASE} step 0 outputs/Y: 1/" in line and "elements differ" in line
    assert "reproduce: csa-conform bridge" in line
    assert f"{CASE}: leaves the goldens: plain at step 0" in result.stdout.splitlines()


def test_a_missing_output_is_a_missing_tensor(tmp_path):
    result = bridge("missing", "--json", tmp_path=tmp_path)
    assert result.exit_code == ExitCode.DIVERGED
    (tensor,) = document(result)["cases"][0]["steps"][0]["stages"][0]["tensors"]
    assert tensor["type"] == "missing-tensor" and tensor["tensor"] == "present_compressed_kv"
    assert "the runner wrote no output_1.nxrt" in tensor["message"]


def test_a_wrong_dtype_is_a_dtype_mismatch(tmp_path):
    result = bridge("dtype", tmp_path=tmp_path)
    assert result.exit_code == ExitCode.DIVERGED
    (line,) = failure_lines(result)
    assert "outputs/Y: dtype differs: expected float32, actual int32" in line


def test_a_malformed_output_file_is_a_runner_error(tmp_path):
    result = bridge("malformed", tmp_path=tmp_path)
    assert result.exit_code == ExitCode.ENVIRONMENT
    (line,) = failure_lines(result)
    assert "outputs/Y: output_0.nxrt: ends inside its payload" in line


def test_unsupported_op_is_unsupported(tmp_path):
    result = bridge("unsupported", "--json", tmp_path=tmp_path)
    assert result.exit_code == ExitCode.DIVERGED
    step = document(result)["cases"][0]["steps"][0]
    assert step["failure"]["type"] == "unsupported"
    assert step["failure"]["message"].startswith("plain run: UNSUPPORTED_OP\top type not supported")


def test_error_on_a_step_that_should_run_is_a_runner_error(tmp_path):
    result = bridge("error", tmp_path=tmp_path)
    assert result.exit_code == ExitCode.ENVIRONMENT
    (line,) = failure_lines(result)
    assert "step 0: plain run: ERROR\\tsession failed: no CUDA device" in line
    assert "1 runner errors" in result.stdout.splitlines()[-1]


def test_error_on_a_rejected_step_is_the_expected_refusal(tmp_path):
    result = bridge("echo", case=REJECTED, tmp_path=tmp_path)
    assert result.exit_code == ExitCode.OK, result.output
    assert "1/1 cases conformant (1 steps, 1 of them rejected by the reference)" in result.stdout


def test_accepting_a_rejected_step_is_a_rejection_mismatch(tmp_path):
    result = bridge("accept-all", case=REJECTED, tmp_path=tmp_path)
    assert result.exit_code == ExitCode.DIVERGED
    (line,) = failure_lines(result)
    assert "the runtime accepted a step the reference rejects (CompressedSparseAttention: missing required" in line


def test_a_hang_is_killed_at_its_bound_with_everything_it_started(tmp_path):
    """The fake runner would answer after 60 s: a TIMEOUT verdict is the bound of 1 s kept."""
    pids = tmp_path / "pids"
    result = bridge("hang", "--timeout-s", "1", tmp_path=tmp_path, env={"FAKE_PID_FILE": str(pids)})
    assert result.exit_code == ExitCode.ENVIRONMENT
    (line,) = failure_lines(result)
    assert "plain run: TIMEOUT: no status within 1 s; the runner was killed" in line
    for pid in map(int, pids.read_text().split()):
        assert gone(pid)


def test_a_crash_names_its_signal(tmp_path):
    result = bridge("crash", tmp_path=tmp_path)
    assert result.exit_code == ExitCode.ENVIRONMENT
    (line,) = failure_lines(result)
    assert "plain run: CRASHED: the runner was killed by SIGSEGV" in line


@pytest.mark.parametrize("mode, said", [
    ("silent", "PROTOCOL: exit code 0 with no status line"),
    ("mislabelled", "PROTOCOL: status OK with exit code 3 (the protocol's is 0)"),
])
def test_a_runner_outside_the_protocol_is_a_runner_error(tmp_path, mode, said):
    result = bridge(mode, tmp_path=tmp_path)
    assert result.exit_code == ExitCode.ENVIRONMENT
    (line,) = failure_lines(result)
    assert said in line


def test_a_runner_without_placeholders_is_refused(tmp_path):
    result = CliRunner().invoke(main, ["bridge", str(CI), "--runner", "true"])
    assert result.exit_code == ExitCode.USAGE
    assert result.stderr.strip().splitlines() == [
        "csa-conform: error: --runner 'true' names no {model}: give 'CMD {model} {case_dir}'"]


def test_a_bad_env_setting_is_refused(tmp_path):
    result = CliRunner().invoke(main, ["bridge", str(CI), "--runner", "r {model} {case_dir}", "--env", "1X=2"])
    assert result.exit_code == ExitCode.USAGE
    assert "'1X=2' is not K=V with K a variable name" in result.stderr


def test_report_turns_a_bridge_document_into_junit_and_html(tmp_path):
    result = bridge("wrong", "--json", tmp_path=tmp_path)
    (tmp_path / "bridge.json").write_text(result.stdout)
    done = CliRunner().invoke(main, ["report", str(tmp_path / "bridge.json"), "--junit", str(tmp_path / "junit.xml"),
                                     "--html", str(tmp_path / "report.html")])
    assert done.exit_code == ExitCode.OK, done.output
    suite = ElementTree.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    assert suite.get("name") == f"csa-conform bridge {CI}"
    (case,) = suite.findall("testcase")
    assert case.get("name") == CASE and case.find("failure").get("type") == "bit-mismatch"
    assert "outputs/Y: 1/" in case.find("failure").get("message")
    assert CASE in (tmp_path / "report.html").read_text()


def test_a_failed_run_still_prints_its_document(tmp_path):
    result = bridge("echo", "--json", case="no-such-case", tmp_path=tmp_path)
    assert result.exit_code == ExitCode.USAGE
    found = document(result)
    assert found["command"] == "bridge" and found["cases"] == [] and "no case" in found["error"]["message"]


@pytest.mark.parametrize("limit, code", [(1e30, ExitCode.OK), (0.0, ExitCode.DIVERGED)])
def test_a_tolerance_envelope_is_the_gate_when_given(tmp_path, limit, code):
    envelope = tmp_path / "tolerances.toml"
    envelope.write_text('[calibration]\nformat = "csa-conform-tolerances"\nmode = "chained"\n\n'
                        f'["sparse_sink_softmax_attention/Y"]\nexact = false\n"abs.max" = {limit!r}\n')
    result = bridge("wrong", "--tolerance", str(envelope), "--json", tmp_path=tmp_path)
    assert result.exit_code == code, result.output
    found = document(result)
    (y,) = [verdict for verdict in found["tolerance"]["stages"] if verdict["tensor"] == "Y"]
    assert (y["bit_exact"], y["within"]) == (False, code == ExitCode.OK)
    assert not found["cases"][0]["passed"]  # the bit-exact verdict stands beside the envelope's


def test_the_envelope_sets_the_mode_and_a_different_mode_is_refused(tmp_path):
    envelope = tmp_path / "tolerances.toml"
    envelope.write_text('[calibration]\nformat = "csa-conform-tolerances"\nmode = "isolated"\n\n'
                        '["sparse_sink_softmax_attention/Y"]\nexact = false\n"abs.max" = 1e30\n')
    ran = document(bridge("wrong", "--tolerance", str(envelope), "--json", tmp_path=tmp_path))
    assert ran["options"]["mode"] == "isolated"
    refused = bridge("wrong", "--tolerance", str(envelope), "--mode", "chained", tmp_path=tmp_path)
    assert refused.exit_code == ExitCode.USAGE and "calibrated isolated" in refused.output
