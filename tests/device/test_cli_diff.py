"""`csa-conform diff` and `bisect`: tables, JSON, exit codes and reproducing command lines.

Runs on the host emulation of the kernels (or with every stage on the host), so the whole
command is exercised without a GPU; test_cuda.py repeats the real thing on a device.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import jsonschema
import pytest
import xmlschema
from click.testing import CliRunner

from csa_conform.check.results import schema
from csa_conform.cli.bisect import bisect
from csa_conform.cli.diff import diff
from csa_conform.cli.report import report_command
from csa_conform.device.plan import FORCE_HOST_ENV, SEED_FORCE_HOST_ENV
from csa_conform.exitcodes import ExitCode
from csa_conform.spec import STAGE_NAMES

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels_mutants"))
from mutants import MUTANTS  # noqa: E402

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
JUNIT_XSD = Path(__file__).resolve().parents[1] / "cli" / "junit.xsd"
SINK = next(mutant for mutant in MUTANTS if mutant.name == "missing_sink")


def invoke(command, *args, env=None):
    return CliRunner().invoke(command, [str(arg) for arg in args], env=env or {})


@pytest.fixture
def no_cuda(monkeypatch):
    """A machine without CuPy: `import cupy` fails."""
    monkeypatch.setitem(sys.modules, "cupy", None)


@pytest.fixture
def broken_kernels(tmp_path):
    return SINK.apply(KERNELS, tmp_path / "kernels")


def test_all_host_control_diffs_clean_without_a_device(device_goldens, no_cuda):
    result = invoke(diff, device_goldens, "--force-host", "all")
    assert result.exit_code == ExitCode.OK, result.output
    assert "ok(host)" in result.output and "DIFF" not in result.output
    assert "device host only (no device launch)" in result.output


@pytest.mark.parametrize("value", ["1", "yes"])
def test_seed_switch_forces_every_stage_to_the_host(device_goldens, no_cuda, value):
    result = invoke(diff, device_goldens, env={SEED_FORCE_HOST_ENV: value})
    assert result.exit_code == ExitCode.OK, result.output
    assert "force-host all" in result.output


def test_no_cuda_is_an_environment_failure(device_goldens, no_cuda):
    result = invoke(diff, device_goldens, env={SEED_FORCE_HOST_ENV: "0"})
    assert result.exit_code == ExitCode.ENVIRONMENT
    assert "CuPy is not importable" in result.output
    assert invoke(diff, device_goldens, "--git-bisect").exit_code == ExitCode.BISECT_SKIP
    assert invoke(bisect, device_goldens, "--case", "boundaries.r4-prefill-5").exit_code == ExitCode.ENVIRONMENT
    result = invoke(diff, device_goldens, "--json")
    assert json.loads(result.output[: result.output.rindex("}") + 1])["exit_code"] == ExitCode.ENVIRONMENT


def test_uncompilable_kernels_are_an_environment_failure(device_goldens, monkeypatch, emulation_backend):
    import csa_conform.device.cuda as cuda
    from csa_conform.errors import DeviceUnavailable

    class RejectingCompiler(type(emulation_backend)):
        def function(self, module):
            raise DeviceUnavailable(f"NVRTC cannot compile {module.path}: error: expected ';'")

    monkeypatch.setattr(cuda, "CudaBackend", lambda: RejectingCompiler(emulation_backend.build_dir))
    result = invoke(diff, device_goldens, "--case", "boundaries.r4-prefill-5")
    assert result.exit_code == ExitCode.ENVIRONMENT
    assert "NVRTC cannot compile" in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--stage", "attn"], "is not a stage"),
        (["--stage", "9"], "is not a stage"),
        (["--mode", "fused"], "Invalid value for '--mode'"),
        (["--force-host", "attn"], "unknown stage"),
        (["--case", "no-such-case*"], "no case"),
        (["--ulp", "-1"], "Invalid value for '--ulp'"),
    ],
)
def test_usage_errors_exit_2(device_goldens, no_cuda, args, message):
    result = invoke(diff, device_goldens, *args)
    assert result.exit_code == ExitCode.USAGE
    assert message in result.output


def test_bad_environment_switch_and_bad_file_are_usage_errors(device_goldens, tmp_path, no_cuda):
    result = invoke(diff, device_goldens, env={FORCE_HOST_ENV: "nonsense"})
    assert result.exit_code == ExitCode.USAGE
    assert invoke(diff, tmp_path / "missing.h5").exit_code == ExitCode.USAGE
    (tmp_path / "junk.h5").write_bytes(b"not hdf5")
    assert invoke(diff, tmp_path / "junk.h5").exit_code == ExitCode.USAGE


@pytest.mark.usefixtures("emulated_cuda")
@pytest.mark.parametrize("mode", ["chained", "isolated"])
def test_clean_kernels_exit_0_with_a_table(device_goldens, mode):
    result = invoke(diff, device_goldens, "--mode", mode, "--case", "boundaries.r4-*")
    assert result.exit_code == ExitCode.OK, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith(f"csa-conform diff {device_goldens}: mode {mode}")
    header = next(line for line in lines if line.startswith("case"))
    assert "1:compress" in header and "8:writeback" in header
    assert "conformant, 0 diverged" in result.output


@pytest.mark.usefixtures("emulated_cuda")
def test_divergence_exits_1_and_every_failure_ends_with_its_reproducer(device_goldens, broken_kernels):
    result = invoke(diff, device_goldens, "--kernels", broken_kernels, "--mode", "isolated")
    assert result.exit_code == ExitCode.DIVERGED, result.output
    assert "FAILURES" in result.output
    reproducers = [line.split("reproduce: ", 1)[1] for line in result.output.splitlines() if "reproduce: " in line]
    assert reproducers
    for command in reproducers:
        words = shlex.split(command)
        assert words[:3] == ["csa-conform", "diff", str(device_goldens)]
        assert words[words.index("--stage") + 1] == "sparse_sink_softmax_attention"
        assert words[words.index("--kernels") + 1] == str(broken_kernels)
    rerun = invoke(diff, *shlex.split(reproducers[0])[2:])
    assert rerun.exit_code == ExitCode.DIVERGED
    case = shlex.split(reproducers[0])[shlex.split(reproducers[0]).index("--case") + 1]
    rows = [words for words in map(str.split, rerun.output.splitlines()) if words[:1] == [case] and "/" not in words]
    assert len(rows) == 1 and "DIFF" in rows[0]


@pytest.mark.usefixtures("emulated_cuda")
def test_json_report(device_goldens, broken_kernels, tmp_path):
    result = invoke(diff, device_goldens, "--kernels", broken_kernels, "--case", "*r128*", "--json")
    assert result.exit_code == ExitCode.DIVERGED
    document = json.loads(result.stdout)
    jsonschema.validate(document, schema())
    (tmp_path / "diff.json").write_text(result.stdout)
    assert invoke(report_command, tmp_path / "diff.json", "--junit", tmp_path / "junit.xml").exit_code == 0
    xmlschema.XMLSchema(str(JUNIT_XSD)).validate(str(tmp_path / "junit.xml"))
    junit = (tmp_path / "junit.xml").read_text()
    assert 'type="bit-mismatch"' in junit and "sparse_sink_softmax_attention/Y" in junit
    assert document["exit_code"] == ExitCode.DIVERGED
    assert document["options"]["stages"] == list(STAGE_NAMES) and document["options"]["mode"] == "chained"
    assert document["control_run"] is False
    failing = [case for case in document["cases"] if not case["passed"]]
    assert failing
    for case in failing:
        assert case["verdicts"]["sparse_sink_softmax_attention"] == "diverged"
        assert case["verdicts"]["index_key_update"] == "n/a"
        (step,) = case["steps"]
        stage = step["stages"][0]
        assert [entry["stage"] for entry in step["stages"]] == ["sparse_sink_softmax_attention", "writeback"]
        first = stage["tensors"][0]["first"]
        assert first["expected_bits"] != first["actual_bits"]
        assert "--stage sparse_sink_softmax_attention" in stage["reproduce"]
    launches = document["kernels"]["launches"]
    assert {launch["module"] for launch in launches} == {"csa_ratio128_compression", "csa_ratio128_attention"}
    assert all(len(launch["source_sha256"]) == 64 and launch["count"] >= 1 for launch in launches)


@pytest.mark.usefixtures("emulated_cuda")
def test_single_stage_compares_only_that_stage(device_goldens, broken_kernels):
    result = invoke(diff, device_goldens, "--kernels", broken_kernels, "--case", "*r128*", "--stage",
                    "compression_update", "--json")
    assert result.exit_code == ExitCode.OK, result.output
    document = json.loads(result.stdout)
    assert all(list(case["verdicts"]) == ["compression_update"] for case in document["cases"])


@pytest.mark.usefixtures("emulated_cuda")
def test_ulp_tolerance_accepts_small_float_differences(device_goldens, broken_kernels):
    strict = json.loads(invoke(diff, device_goldens, "--kernels", broken_kernels, "--case", "*r128*",
                               "--json").stdout)
    worst = max(
        diff_["ulp"]["max"]
        for case in strict["cases"] for step in case["steps"] for stage in step["stages"]
        for diff_ in stage["tensors"] if "ulp" in diff_
    )
    relaxed = invoke(diff, device_goldens, "--kernels", broken_kernels, "--case", "*r128*", "--ulp", worst)
    assert relaxed.exit_code == ExitCode.OK, relaxed.output


@pytest.mark.usefixtures("emulated_cuda")
def test_bisect_names_step_stage_tensor_element_and_origin(device_goldens, broken_kernels):
    from device_fixtures import pick

    from csa_conform.golden import GoldenFile

    with GoldenFile(device_goldens) as golden:
        case = pick(golden.case_ids(), "boundaries.r128-*")
    result = invoke(bisect, device_goldens, "--case", case, "--kernels", broken_kernels)
    assert result.exit_code == ExitCode.DIVERGED, result.output
    assert "stage sparse_sink_softmax_attention" in result.output
    assert "tensor Y, element b=" in result.output and "ulp apart" in result.output
    assert "originates in sparse_sink_softmax_attention" in result.output
    document = json.loads(invoke(bisect, device_goldens, "--case", case, "--kernels", broken_kernels,
                                 "--json").stdout)
    jsonschema.validate(document, schema())
    assert document["control_run"] is False
    found = document["bisect"]["first_divergence"]
    assert found["tensor"] == "Y" and found["element"]["ulp"] >= 1
    assert document["bisect"]["origin"] == "sparse_sink_softmax_attention"
    (step,) = document["cases"][0]["steps"]
    assert step["step"] == found["step"] and step["stages"][0]["tensors"][0]["tensor"] == "Y"
    assert "--mode isolated" in step["stages"][0]["reproduce"]
    clean = invoke(bisect, device_goldens, "--case", case)
    assert clean.exit_code == ExitCode.OK and "no divergence" in clean.output
    assert invoke(bisect, device_goldens, "--case", "nope").exit_code == ExitCode.USAGE
