"""The stand-in runner (the oracle behind the runtime's protocol): ci cases conformant through the bridge,
and a perturbed output of one step of one stream fails exactly that case at that step."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from csa_conform.check.results import schema
from csa_conform.cli import main
from csa_conform.exitcodes import ExitCode

CI = Path(__file__).resolve().parents[2] / "goldens" / "ci.h5"
STAND_IN = f"{sys.executable} -m csa_conform.bridge.stand_in"
SUBSET = "edges.r*-ties-b1n1*"  # two-step streams: ratio 128 with f32 and with fp8 records, ratio 4
PERTURBED = "edges.r128-f32-ties-b1n1"
ENGINE = ["--env", "CSA_CONFORM_ENGINE=numpy"]  # the same bytes; no compiled kernels to load per step


def bridge(*words: str):
    result = CliRunner().invoke(main, ["bridge", str(CI), *ENGINE, *words])
    assert "Traceback" not in result.output, result.output
    return result


def test_a_perturbed_force_host_run_fails_exactly_its_case_at_its_step():
    result = bridge("--case", SUBSET, "--json", "--jobs", "2", "--runner",
                    f"{STAND_IN} --perturb {PERTURBED}@1:Y --perturb-when ONNX_GENAI_CSA_FORCE_HOST "
                    "{model} {case_dir}")
    assert result.exit_code == ExitCode.DIVERGED, result.output
    document = json.loads(result.stdout)
    jsonschema.validate(document, schema())
    verdicts = {case["case"]: case["passed"] for case in document["cases"]}
    assert verdicts == {"edges.r128-f32-ties-b1n1": False, "edges.r128-fp8-ties-b1n1": True,
                        "edges.r4-ties-b1n1-i4": True}
    (failing,) = [case for case in document["cases"] if not case["passed"]]
    (step,) = failing["steps"]
    (stage,) = step["stages"]
    (tensor,) = stage["tensors"]
    assert (step["step"], stage["stage"], tensor["tensor"], tensor["mismatches"]) == (1, "outputs(force-host)", "Y", 1)
    assert tensor["first"]["index"] == 0
    streams = {stream["case"]: stream for stream in document["bridge"]["streams"]}
    assert streams[PERTURBED] == {"case": PERTURBED, "first_divergence": {"plain": None, "force-host": 1},
                                  "leaves_first": "force-host"}
    assert {stream["leaves_first"] for case, stream in streams.items() if case != PERTURBED} == {"neither"}
    statuses = document["bridge"]["statuses"]
    assert len(statuses) == 3 * 2 * 2 and {status["status"] for status in statuses} == {"OK"}
    assert document["bridge"]["env"] == {"CSA_CONFORM_ENGINE": "numpy"}


def test_a_rejected_step_is_refused_with_the_contracts_message():
    result = bridge("--case", "errors.attr-num-heads-float", "--force-host-env", "", "--json", "--runner",
                    f"{STAND_IN} {{model}} {{case_dir}}")
    assert result.exit_code == ExitCode.OK, result.output
    (status,) = json.loads(result.stdout)["bridge"]["statuses"]
    assert (status["status"], status["exit_code"]) == ("ERROR", 3)
    assert status["message"] == "CompressedSparseAttention: missing required integer attribute num_heads"


def test_the_stand_in_refuses_bad_arguments_as_the_runner_does(tmp_path):
    done = subprocess.run([sys.executable, "-m", "csa_conform.bridge.stand_in", "--perturb", "no-step",
                           str(tmp_path / "m.onnx"), str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 64 and "usage: --perturb CASE@STEP:OUTPUT" in done.stderr
    done = subprocess.run([sys.executable, "-m", "csa_conform.bridge.stand_in", str(tmp_path / "m.onnx"),
                           str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 3 and done.stdout.startswith("ERROR\tfailed to load model ")


# One glob per family of the ci suite, both ratios, f32 and FP8 caches, streams and rejected steps:
# each step through the runner costs a process start (the onnx import is most of it), so the whole
# suite (247 steps) is `csa-conform bridge goldens/ci.h5 --runner ...` by hand, not a unit test.
FAMILIES = {"boundaries.r*-resumed-*": 3, "edges.r128-fp8-*b2*": 3, "quant-edge.r4-*": 3,
            "seed-closed-form.r128-stream-*": 1, "errors.attr-r4-*": 4}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_of_ci_cases_is_conformant_through_the_stand_in(family):
    result = bridge("--case", family, "--force-host-env", "", "--jobs", "2", "--json", "--runner",
                    f"{STAND_IN} {{model}} {{case_dir}}")
    assert result.exit_code == ExitCode.OK, result.output
    document = json.loads(result.stdout)
    assert len(document["cases"]) >= FAMILIES[family] and all(case["passed"] for case in document["cases"])
    statuses = {status["status"] for status in document["bridge"]["statuses"]}
    if family.startswith("errors."):
        assert statuses == {"ERROR"}
    else:  # a stream's rejected step (a quant edge) is an ERROR the reference also gives
        assert "OK" in statuses and statuses <= {"OK", "ERROR"}


@pytest.mark.slow
def test_the_host_backend_stand_in_is_conformant_plain_and_forced():
    result = bridge("--case", "edges.r4-ties-b1n1-i4", "--runner",
                    f"{STAND_IN} --backend host {{model}} {{case_dir}}")
    assert result.exit_code == ExitCode.OK, result.output
