"""`diff --sanitize TOOL`: compute-sanitizer's report parsed into findings, the run under it, and
the clear exit 4 when the tool is absent.

The sample reports follow compute-sanitizer's documented text output (a `=========` prefix,
one unindented line per error, indented `at`, `by thread`, `Access at`/`Address` lines, and the
ERROR SUMMARY). The run is tested with a stand-in compute-sanitizer on PATH that runs the child
diff (every stage on the host) and writes a sample report where --log-file says.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import textwrap
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from csa_conform.check.results import schema
from csa_conform.cli.diff import diff
from csa_conform.cli.report import report_command
from csa_conform.device import sanitizer
from csa_conform.device.sanitizer import kernel_name, parse_report
from csa_conform.exitcodes import ExitCode

MEMCHECK = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 4 bytes
=========     at csa_ratio4_index_select+0x1f30
=========     by thread (0,0,0) in block (9,0,0)
=========     Access at 0x7f3c5e000928 is out of bounds
=========     and is 0 bytes after the nearest allocation at 0x7f3c5e000800 of size 296 bytes
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: cuLaunchKernel [0x2cd7e0] in libcuda.so.1
=========
========= Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure" on CUDA API call to cudaDeviceSynchronize.
=========     Saved host backtrace up to driver entry point at error
=========
========= ERROR SUMMARY: 2 errors
"""

OLD_MEMCHECK = """\
========= CUDA-MEMCHECK
========= Invalid __global__ read of size 8
=========     at 0x000000c8 in /src/helper.cuh:75:void projection<double>(double*, int)
=========     by thread (9,0,0) in block (0,0,0)
=========     Address 0x000370e8 is out of bounds
=========
========= ERROR SUMMARY: 1 error
"""

RACECHECK = """\
========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at csa_ratio4_sink_attention+0x4a0 in block_quant.cuh:631
=========     and Read access at csa_ratio4_sink_attention+0x9e0 in block_quant.cuh:651 [248 hazards]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""

INITCHECK = """\
========= COMPUTE-SANITIZER
========= Uninitialized __global__ memory read of size 4 bytes
=========     at csa_ratio4_sink_attention+0x2b10
=========     by thread (3,0,0) in block (17,0,0)
=========     Address 0x7f0c3a00a044
=========
========= ERROR SUMMARY: 1 error
"""

SYNCCHECK = """\
========= COMPUTE-SANITIZER
========= Barrier error detected. Divergent thread(s) in warp
=========     at csa_ratio128_sink_attention(const float *, const float *)+0x1d40 in block_quant.cuh:640
=========     by thread (0,0,0) in block (2,0,0)
=========
========= ERROR SUMMARY: 1 error
"""

CLEAN = "========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n"


def test_memcheck_out_of_bounds_write_and_the_launch_failure_it_causes():
    findings, count = parse_report(MEMCHECK, "memcheck")
    assert count == 2
    write, failure = (finding.to_dict() for finding in findings)
    assert write == {
        "tool": "memcheck", "kind": "invalid-write", "message": "Invalid __global__ write of size 4 bytes",
        "kernel": "csa_ratio4_index_select", "size": 4, "address": "0x7f3c5e000928", "thread": "0,0,0",
        "block": "9,0,0",
        "detail": "is out of bounds, 0 bytes after the nearest allocation at 0x7f3c5e000800 of size 296 bytes",
        "summary": "memcheck invalid-write: Invalid __global__ write of size 4 bytes in csa_ratio4_index_select "
                   "thread (0,0,0) block (9,0,0) address 0x7f3c5e000928; is out of bounds, 0 bytes after the nearest "
                   "allocation at 0x7f3c5e000800 of size 296 bytes",
    }
    assert (failure["kind"], failure["detail"]) == ("cuda-error", "unspecified launch failure")


def test_the_older_location_format_names_the_kernel_too():
    [finding], count = parse_report(OLD_MEMCHECK, "memcheck")
    assert (finding.kind, finding.kernel, finding.size, finding.address, count) == (
        "invalid-read", "projection<double>", 8, "0x000370e8", 1)
    assert kernel_name("csa_x(const float *, int)+0x50 in f.cu:14") == "csa_x"


def test_racecheck_initcheck_and_synccheck_reports():
    [race], count = parse_report(RACECHECK, "racecheck")
    assert (race.kind, race.kernel, count) == ("race", "csa_ratio4_sink_attention", 1)
    assert parse_report("========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n", "racecheck") == ([], 0)
    assert "and Read access at csa_ratio4_sink_attention+0x9e0" in race.detail and "[248 hazards]" in race.detail
    [uninitialized], _ = parse_report(INITCHECK, "initcheck")
    assert (uninitialized.kind, uninitialized.kernel, uninitialized.thread, uninitialized.block,
            uninitialized.address) == ("uninitialized-read", "csa_ratio4_sink_attention", "3,0,0", "17,0,0",
                                       "0x7f0c3a00a044")
    [barrier], _ = parse_report(SYNCCHECK, "synccheck")
    assert (barrier.kind, barrier.kernel, barrier.detail) == (
        "barrier", "csa_ratio128_sink_attention", "Divergent thread(s) in warp")


def test_a_clean_report_has_no_finding_and_a_zero_count():
    assert parse_report(CLEAN, "memcheck") == ([], 0)
    assert parse_report("", "memcheck") == ([], None)


@pytest.fixture
def no_sanitizer(monkeypatch, tmp_path):
    """A machine without compute-sanitizer: not on PATH, not in $CUDA_HOME, no default toolkit."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.setattr(sanitizer, "DEFAULT_TOOLKITS", ())


def test_an_absent_sanitizer_is_an_environment_failure(device_goldens, no_sanitizer):
    result = CliRunner().invoke(diff, [str(device_goldens), "--sanitize", "memcheck"])
    assert result.exit_code == ExitCode.ENVIRONMENT
    assert "compute-sanitizer is not installed" in result.output
    skip = CliRunner().invoke(diff, [str(device_goldens), "--sanitize", "memcheck", "--git-bisect"])
    assert skip.exit_code == ExitCode.BISECT_SKIP
    document = CliRunner().invoke(diff, [str(device_goldens), "--sanitize", "racecheck", "--json"]).stdout
    assert json.loads(document[: document.rindex("}") + 1])["exit_code"] == ExitCode.ENVIRONMENT


def _stand_in(directory: Path, report: str) -> Path:
    """A compute-sanitizer that runs the command after its options and writes ``report`` to --log-file."""
    script = directory / "compute-sanitizer"
    script.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import subprocess, sys
        args = sys.argv[1:]
        options = {{}}
        while args[0].startswith("--"):
            options[args[0]] = args[1]
            args = args[2:]
        assert options["--tool"] in ("memcheck", "racecheck", "initcheck", "synccheck"), options
        done = subprocess.run(args)
        with open(options["--log-file"], "w") as log:
            log.write({report!r})
        sys.exit(done.returncode)
        """))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def _sanitized(device_goldens, tmp_path, report, *extra):
    _stand_in(tmp_path, report)
    env = {"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": os.pathsep.join(sys.path)}
    return CliRunner().invoke(diff, [str(device_goldens), "--sanitize", "memcheck", "--force-host", "all",
                                     "--case", "boundaries.r4-*", *extra], env=env)


def test_findings_fail_the_run_and_land_in_the_document_and_junit(device_goldens, tmp_path):
    result = _sanitized(device_goldens, tmp_path, MEMCHECK, "--json")
    assert result.exit_code == ExitCode.DIVERGED, result.output[-2000:]
    document = json.loads(result.stdout)
    jsonschema.validate(document, schema())
    assert document["options"]["sanitize"] == "memcheck" and not document["passed"]
    assert document["summary"]["failed"] == 0, "the payloads themselves are clean"
    sanitizer = document["sanitizer"]
    assert sanitizer["error_count"] == 2 and [f["kind"] for f in sanitizer["findings"]] == ["invalid-write",
                                                                                            "cuda-error"]
    assert sanitizer["reproduce"].startswith("compute-sanitizer --tool memcheck csa-conform diff ")
    (tmp_path / "run.json").write_text(result.stdout)
    junit = tmp_path / "junit.xml"
    CliRunner().invoke(report_command, [str(tmp_path / "run.json"), "--junit", str(junit)])
    text = junit.read_text()
    assert 'classname="diff.sanitizer" name="memcheck"' in text and 'type="sanitizer"' in text
    plain = _sanitized(device_goldens, tmp_path, MEMCHECK)
    assert plain.exit_code == ExitCode.DIVERGED
    assert "memcheck reported 2 errors" in plain.output
    assert "invalid-write: Invalid __global__ write of size 4 bytes in csa_ratio4_index_select" in plain.output


def test_a_clean_report_keeps_the_diffs_exit_code(device_goldens, tmp_path):
    result = _sanitized(device_goldens, tmp_path, CLEAN, "--json")
    assert result.exit_code == ExitCode.OK, result.output[-2000:]
    document = json.loads(result.stdout)
    jsonschema.validate(document, schema())
    assert document["passed"] and document["sanitizer"]["findings"] == []


def test_sanitize_runs_one_process(device_goldens):
    result = CliRunner().invoke(diff, [str(device_goldens), "--sanitize", "memcheck", "--devices", "0,1"])
    assert result.exit_code == ExitCode.USAGE and "leave out --devices" in result.output


def test_an_error_of_the_sanitized_diff_keeps_its_exit_code(device_goldens, tmp_path):
    """No visible device in the child: exit 4 as a plain diff would, and 125 under --git-bisect."""
    _stand_in(tmp_path, CLEAN)
    env = {"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": os.pathsep.join(sys.path),
           "CUDA_VISIBLE_DEVICES": ""}
    arguments = [str(device_goldens), "--sanitize", "memcheck", "--case", "boundaries.r4-*"]
    stopped = CliRunner().invoke(diff, arguments, env=env)
    assert stopped.exit_code == ExitCode.ENVIRONMENT, stopped.output[-2000:]
    assert "the diff under compute-sanitizer --tool memcheck stopped: " in stopped.output
    assert CliRunner().invoke(diff, arguments + ["--git-bisect"], env=env).exit_code == ExitCode.BISECT_SKIP


def test_a_child_the_tool_stopped_is_judged_by_the_tool(device_goldens, tmp_path):
    """memcheck aborts a kernel that writes out of bounds, so the child diff stops with a launch
    failure (exit 4); what the tool reported is the verdict: exit 1 with its findings."""
    _stand_in(tmp_path, MEMCHECK)
    env = {"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": os.pathsep.join(sys.path),
           "CUDA_VISIBLE_DEVICES": ""}
    result = CliRunner().invoke(diff, [str(device_goldens), "--sanitize", "memcheck", "--case", "boundaries.r4-*",
                                       "--git-bisect", "--json"], env=env)
    assert result.exit_code == ExitCode.DIVERGED, result.output[-2000:]
    document = json.loads(result.stdout)
    jsonschema.validate(document, schema())
    assert document["sanitizer"]["error_count"] == 2 and not document["passed"]
