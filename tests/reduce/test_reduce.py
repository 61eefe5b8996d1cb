"""`csa-conform reduce` on the host emulation: a planted bug's failing case shrinks to a one-case file
that verifies, still diverges first at the same stage and tensor, and passes with the built-in kernels."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from csa_conform.cli import main
from csa_conform.exitcodes import ExitCode
from csa_conform.golden import GoldenFile
from csa_conform.streams import heads, later_tokens, rows, stream_of, tokens, topk
from csa_conform.verify import verify_case
from mutants import MUTANTS

ROOT = Path(__file__).resolve().parents[2]
CI_GOLDENS = ROOT / "goldens" / "ci.h5"
KERNELS = ROOT / "kernels"
MUTANT = {mutant.name: mutant for mutant in MUTANTS}

pytestmark = pytest.mark.usefixtures("emulated_cuda")


def _reduce(*args) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["reduce", *map(str, args)])
    return result.exit_code, result.stdout, result.stderr


def _first_divergence(path: Path, case: str, kernels: Path | None = None) -> tuple[int, str]:
    args = ["bisect", str(path), "--case", case] + (["--kernels", str(kernels)] if kernels else [])
    result = CliRunner().invoke(main, args)
    return result.exit_code, result.stdout


@pytest.mark.parametrize("mutant, case, stage", [
    ("index_score_without_head_normalization", "random.r4-b2n2-i2-k512", "index_scoring"),
    ("missing_sink", "random.r128-f32-b2n2", "sparse_sink_softmax_attention"),
    ("fp8_scale_rounded_down", "boundaries.r4-prefill-9", "compression_update"),
])
def test_a_failing_case_shrinks_to_a_repro_that_verifies_diverges_and_passes_with_the_builtins(
        mutant, case, stage, tmp_path):
    kernels = MUTANT[mutant].apply(KERNELS, tmp_path / "kernels")
    out = tmp_path / "repro.h5"
    code, stdout, stderr = _reduce(CI_GOLDENS, "--case", case, "--kernels", kernels, "-o", out)
    assert code == ExitCode.DIVERGED, stdout + stderr
    assert stderr.startswith(f"reduce: {case} diverges first at step ") and "reduce: trial 1: " in stderr
    before, after = (int(n.replace(",", "")) for n in re.search(r"input elements: ([\d,]+) -> ([\d,]+)", stdout).groups())
    assert after < before
    assert f"still diverges first at {stage}/" in stdout
    assert "verified against the oracle: yes" in stdout and "built-in kernels: pass" in stdout
    reduced = f"{case}.reduced"
    assert f"reproduce: csa-conform diff {out} --stage all --mode chained --case {reduced} --kernels {kernels}" \
        in stdout
    with GoldenFile(out) as golden:
        assert golden.case_ids() == [reduced]
        assert verify_case(golden, reduced).passed
    code, text = _first_divergence(out, reduced, kernels)
    assert code == ExitCode.DIVERGED and f"stage {stage}" in text.splitlines()[0]
    code, text = _first_divergence(out, reduced)
    assert code == ExitCode.OK, text


def test_a_case_that_does_not_diverge_exits_0_and_writes_nothing(tmp_path):
    out = tmp_path / "repro.h5"
    code, stdout, _ = _reduce(CI_GOLDENS, "--case", "random.r4-bias-1", "-o", out, "-q")
    assert code == ExitCode.OK
    assert stdout == "case random.r4-bias-1: no divergence (chained, every stage): nothing to reduce\n"
    assert not out.exists()


def test_usage_errors_are_one_line(tmp_path):
    out = tmp_path / "repro.h5"
    out.write_bytes(b"")
    result = CliRunner().invoke(main, ["reduce", str(CI_GOLDENS), "--case", "random.r4-bias-1", "-o", str(out)])
    assert result.exit_code == ExitCode.USAGE and "pass --force to overwrite it" in result.stderr
    result = CliRunner().invoke(main, ["reduce", str(CI_GOLDENS), "--case", "no-such-case", "-o",
                                       str(tmp_path / "x.h5")])
    assert result.exit_code == ExitCode.USAGE and result.stderr.count("\n") == 1 and "no case" in result.stderr


def test_each_reduction_gives_a_stream_the_oracle_accepts_with_the_smaller_shape():
    with GoldenFile(CI_GOLDENS) as golden:
        stream = stream_of(golden, "random.r4-b2n2-i2-k512")
    assert (stream.batch, stream.heads, stream.topk, len(stream.steps)) == (2, 2, 512, 2)
    assert stream.threaded[1] == {"past_compressed_kv", "past_compression_carry", "past_index_key",
                                  "past_index_carry"}
    first = stream.from_step(1)
    for edited, shape in [(rows(first, [1]), {"B": 1}), (heads(first, [0]), {"N": 1}), (topk(first, 1), {"topk": 1})]:
        assert {key: edited.shape()[key] for key in shape} == shape
        assert edited.case("x", "") is not None
    with GoldenFile(CI_GOLDENS) as golden:
        prefill = stream_of(golden, "boundaries.r4-prefill-9")
    shorter = tokens(prefill, 5)
    assert shorter.shape()["S"] == 5 and int(shorter.steps[0]["total_sequence_length"]) == 5
    assert shorter.case("x", "") is not None
    later = later_tokens(prefill, 4)
    assert later.shape()["S"] == 5 and int(later.steps[0]["total_sequence_length"]) == 9
    resumed = later.case("x", "")
    whole = prefill.case("x", "")
    # the resumed suffix ends in the state the whole prefill ends in
    for name in ("present_compressed_kv", "present_index_key"):
        assert np.array_equal(resumed.steps[0].outputs[name], whole.steps[0].outputs[name])
