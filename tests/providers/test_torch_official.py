"""The PyTorch provider of DeepSeek's official numerics: inside the envelope calibrated from the official
profile, and a planted bug (the sink left out) outside it. torch is an optional extra: without it these skip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from csa_conform.cli import main
from csa_conform.exitcodes import ExitCode

pytest.importorskip("torch", reason="torch is not installed (pip install 'csa-conform[torch]')")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "providers" / "torch_official.py"
TORCH = f"python:{EXAMPLE}:TorchOfficial"
WITHOUT_SINK = f"python:{EXAMPLE}:TorchOfficialWithoutSink"
CASES = "random.*"


def invoke(*args) -> object:
    return CliRunner().invoke(main, [str(arg) for arg in args])


@pytest.fixture(scope="module")
def envelope(tmp_path_factory) -> tuple[Path, Path]:
    """A reference file of the ci suite's random cases and the envelope calibrated on it (isolated)."""
    work = tmp_path_factory.mktemp("official")
    goldens, tolerances = work / "ci-random.h5", work / "tolerances.toml"
    assert invoke("generate", "--suite", "ci", "--case", CASES, "-o", goldens).exit_code == ExitCode.OK
    assert invoke("calibrate", goldens, "-o", tolerances).exit_code == ExitCode.OK
    return goldens, tolerances


def test_the_torch_official_numerics_are_inside_the_calibrated_envelope(envelope):
    goldens, tolerances = envelope
    result = invoke("diff", goldens, "--kernels", TORCH, "--tolerance", tolerances, "--json")
    assert result.exit_code == ExitCode.OK, result.output
    document = json.loads(result.stdout)
    assert document["kernels"]["kernels"]["provider"]["host_stages"] == [
        "compression_update", "index_key_update", "index_query_finalize", "writeback"]
    assert document["tolerance"]["within"] is True


def test_the_sink_left_out_is_outside_the_envelope_at_attention(envelope):
    goldens, tolerances = envelope
    result = invoke("diff", goldens, "--kernels", WITHOUT_SINK, "--tolerance", tolerances)
    assert result.exit_code == ExitCode.DIVERGED, result.output
    outside = [line.split()[0] for line in result.output.splitlines() if " NO " in line]
    assert outside == ["sparse_sink_softmax_attention/Y"]


def test_it_differs_from_the_numpy_official_profile_by_rounding_only(envelope):
    """Stage by stage against the NumPy profile on the same inputs: the exponential is torch's, nothing else."""
    goldens, _ = envelope
    result = invoke("gap", goldens, "--profile", "official", "--mode", "isolated", "--kernels", TORCH, "--json")
    assert result.exit_code == ExitCode.OK, result.output
    rows = {(row["stage"], row["tensor"]): row for row in json.loads(result.stdout)["gap"]["tensors"]}
    assert all(row["steps_identical"] == row["steps"] for (stage, _), row in rows.items()
               if stage != "sparse_sink_softmax_attention")
    assert rows[("sparse_sink_softmax_attention", "Y")]["ulp"]["max"] <= 2
