"""A kernel written to the official numerics fails the bit-exact gate and passes diff --tolerance; a worse
one fails both; putting the sink inside the max is the same softmax and stays inside the envelope.

On the host emulation the envelope is calibrated on the committed ci suite (the full suite takes minutes
to generate and measure here); the GPU run (gpu/official-kernels.sh) calibrates on the full suite.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from csa_conform.cli import main
from csa_conform.exitcodes import ExitCode
from variants import VARIANTS, apply, attention_row

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "kernels"
CI = ROOT / "goldens" / "ci.h5"
ATTENTION = ("sparse_sink_softmax_attention/Y", "sparse_sink_softmax_attention/scores")


def invoke(*args: str):
    return CliRunner().invoke(main, [str(arg) for arg in args])


@pytest.fixture(scope="module")
def tolerances(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("official-kernels") / "tolerances.toml"
    assert invoke("calibrate", CI, "-o", path).exit_code == ExitCode.OK
    return path


def run(kernels: Path, goldens: Path, tolerances: Path | None = None) -> tuple[int, dict]:
    args = ["diff", goldens, "--kernels", kernels, "--json"] + (["--tolerance", tolerances] if tolerances else [])
    result = invoke(*args)
    assert result.exit_code in (ExitCode.OK, ExitCode.DIVERGED), result.output
    return result.exit_code, json.loads(result.stdout)


def verdicts(document: dict) -> dict[str, dict]:
    return {f"{stage['stage']}/{stage['tensor']}": stage for stage in document["tolerance"]["stages"]}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_row_replaces_the_builtin_one_exactly_once(variant, tmp_path):
    kernels = apply(variant, KERNELS, tmp_path / "kernels")
    text = (kernels / "block_quant.cuh").read_text()
    assert attention_row(variant) in text and "@" not in attention_row(variant)
    assert text.count("__device__ void csa_sink_attention(") == 1


# variant -> (bit-exact against the reference, inside the calibrated envelope)
EXPECTED = {"official": (False, True), "bf16_accumulation": (False, False), "sink_in_max": (False, True)}


def check(variant: str, goldens: Path, tolerances: Path, tmp_path: Path) -> None:
    kernels = apply(variant, KERNELS, tmp_path / "kernels")
    exact, within = EXPECTED[variant]
    code, _ = run(kernels, goldens)
    assert code == (ExitCode.OK if exact else ExitCode.DIVERGED)
    code, document = run(kernels, goldens, tolerances)
    judged = verdicts(document)
    y = judged["sparse_sink_softmax_attention/Y"]
    assert (y["bit_exact"], y["within"]) == (exact, within), json.dumps(y["bounds"])
    assert document["tolerance"]["within"] == within and code == (ExitCode.OK if within else ExitCode.DIVERGED)
    assert all(verdict["bit_exact"] for key, verdict in judged.items() if key not in ATTENTION)


@pytest.mark.usefixtures("emulated_cuda")
@pytest.mark.parametrize("variant", sorted(EXPECTED))
def test_variant_on_the_host_emulation(variant, device_goldens, tolerances, tmp_path):
    check(variant, device_goldens, tolerances, tmp_path)


@pytest.mark.cuda
@pytest.mark.parametrize("variant", sorted(EXPECTED))
def test_variant_on_the_device(variant, cuda_device, tolerances, tmp_path):
    check(variant, CI, tolerances, tmp_path)


# --- the official-profile workflow with default options: calibrate, then diff --tolerance -------------

OFFICIAL_CASES = "random.r*-bias-[1B]*"  # ratio 128 and ratio 4 (its selection moves with the scores, chained)


@pytest.fixture(scope="module")
def official(tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    """Goldens of the official profile, and their envelope calibrated in each mode."""
    folder = tmp_path_factory.mktemp("official-workflow")
    goldens = folder / "official.h5"
    made = invoke("generate", "--profile", "official", "--case", OFFICIAL_CASES, "-o", goldens, "-q")
    assert made.exit_code == ExitCode.OK, made.output
    envelopes = {}
    for mode in ("isolated", "chained"):
        envelopes[mode] = folder / f"{mode}.toml"
        result = invoke("calibrate", goldens, "--mode", mode, "-o", envelopes[mode])
        assert result.exit_code == ExitCode.OK, result.output
    return goldens, envelopes


# kernels -> inside the envelope: the reference's own numerics (the built-in kernels), a kernel written to
# the official numerics, and one worse than both
WORKFLOW = {"builtin": True, "official": True, "bf16_accumulation": False}


@pytest.mark.slow  # generates and calibrates official goldens, then six emulated diff runs
@pytest.mark.usefixtures("emulated_cuda")
@pytest.mark.parametrize("mode", ["isolated", "chained"])
@pytest.mark.parametrize("kernels", sorted(WORKFLOW))
def test_official_goldens_calibrated_gate_a_diff_run_in_the_calibrated_mode(official, kernels, mode, tmp_path):
    goldens, envelopes = official
    directory = KERNELS if kernels == "builtin" else apply(kernels, KERNELS, tmp_path / "kernels")
    code, document = run(directory, goldens, envelopes[mode])
    assert document["options"]["mode"] == mode  # the file's mode, --mode left out
    judged = document["tolerance"]
    assert judged["within"] == WORKFLOW[kernels], json.dumps([stage for stage in judged["stages"]
                                                               if not stage["within"]])
    assert code == (ExitCode.OK if WORKFLOW[kernels] else ExitCode.DIVERGED)
    if kernels == "builtin":  # the reference against official goldens: inside, not bit-exact
        assert not verdicts(document)["sparse_sink_softmax_attention/Y"]["bit_exact"]

