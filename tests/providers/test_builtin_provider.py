"""The built-in kernels behind the provider protocol judge exactly as the native backend does: the protocol's
cross-check. On the CPU through the g++ host emulation; on a GPU through CuPy (marked cuda)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from csa_conform.cli import main
from csa_conform.device.host import GXX

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels_mutants"))
from mutants import MUTANTS  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CI = str(ROOT / "goldens" / "ci.h5")
EXAMPLE = ROOT / "examples" / "providers" / "builtin_kernels.py"
HOST = f"python:{EXAMPLE}:HostBuiltinKernels"
CUPY = f"python:{EXAMPLE}:CupyBuiltinKernels"
CASES = "boundaries.r4-prefill-5"
MUTANT = next(mutant for mutant in MUTANTS if mutant.name == "index_score_without_head_normalization")


def document(*args: str, env: dict | None = None) -> dict:
    result = CliRunner().invoke(main, ["diff", CI, "--json", *args], env=env)
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout)


def verdicts(doc: dict) -> list:
    """What must be the same whichever way the kernels were launched: each case's verdicts and failing tensors
    (not its reproduce commands or the names of what computed a stage, which name the kernels)."""
    return [(case["case"], case["passed"], case["verdicts"],
             [[(entry["stage"], entry.get("tensors")) for entry in step["stages"]] for step in case["steps"]])
            for case in doc["cases"]]


def same_judgement(native: dict, provider: dict) -> None:
    assert verdicts(provider) == verdicts(native)
    untimed = [{key: value for key, value in doc["summary"].items() if key != "time_s"} for doc in (native, provider)]
    assert provider["exit_code"] == native["exit_code"] and untimed[0] == untimed[1]


@pytest.mark.skipif(GXX is None, reason="the host emulation of the kernels needs g++")
@pytest.mark.parametrize("mode", ["chained", "isolated"])
def test_the_builtin_kernels_as_a_provider_judge_as_the_host_backend(mode):
    native = document("--backend", "host", "--mode", mode, "--case", "boundaries.r*")
    provider = document("--kernels", HOST, "--mode", mode, "--case", "boundaries.r*")
    same_judgement(native, provider)


@pytest.mark.skipif(GXX is None, reason="the host emulation of the kernels needs g++")
def test_a_planted_bug_is_judged_alike_through_the_provider(tmp_path):
    kernels = MUTANT.apply(ROOT / "kernels", tmp_path / "kernels")
    native = document("--backend", "host", "--kernels", str(kernels), "--case", CASES)
    provider = document("--kernels", HOST, "--case", CASES, env={"CSA_PROVIDER_KERNELS": str(kernels)})
    assert native["exit_code"] == 1
    same_judgement(native, provider)


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["chained", "isolated"])
def test_the_cupy_provider_judges_every_ci_case_as_the_native_backend(cuda_device, mode):
    native = document("--mode", mode)
    provider = document("--kernels", CUPY, "--mode", mode)
    same_judgement(native, provider)


@pytest.mark.cuda
def test_the_cupy_provider_judges_a_planted_bug_as_the_native_backend(cuda_device, tmp_path):
    kernels = MUTANT.apply(ROOT / "kernels", tmp_path / "kernels")
    native = document("--kernels", str(kernels))
    provider = document("--kernels", CUPY, env={"CSA_PROVIDER_KERNELS": str(kernels)})
    assert native["exit_code"] == 1
    same_judgement(native, provider)
