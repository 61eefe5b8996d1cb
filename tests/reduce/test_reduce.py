"""`csa-conform reduce` on the host emulation: a planted bug's failing case shrinks to a one-case file
that verifies, still diverges first at the same stage and tensor, and passes with the built-in kernels."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from diagnosis_mutants import DIAGNOSED
from mutants import MUTANTS

from csa_conform.check.verify import verify_case
from csa_conform.cli import main
from csa_conform.exitcodes import ExitCode
from csa_conform.golden import GoldenFile
from csa_conform.golden.edits import (
    CARRIES,
    fitted,
    heads,
    later_tokens,
    past_records,
    restarted,
    rows,
    stream_of,
    tokens,
    topk,
    without_bias,
    without_carries,
)

ROOT = Path(__file__).resolve().parents[2]
CI_GOLDENS = ROOT / "goldens" / "ci.h5"
KERNELS = ROOT / "kernels"
MUTANT = {mutant.name: mutant for mutant in (*MUTANTS, *(diagnosed.mutant for diagnosed in DIAGNOSED))}

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


def _elements(stdout: str) -> tuple[int, int, int]:
    found = re.search(r"input elements: ([\d,]+) -> ([\d,]+) \([\d.]+%\); the contract fixes ([\d,]+) of them", stdout)
    return tuple(int(n.replace(",", "")) for n in found.groups())


def test_a_single_step_case_restarts_at_position_0_down_to_what_the_contract_fixes(tmp_path):
    """A resumed one-step B = 1 case at 2^17: the failing token alone as a prefill from 0 keeps the
    attention divergence, and only the contract's fixed inputs and one token remain (<= 1/4 here)."""
    kernels = MUTANT["missing_sink"].apply(KERNELS, tmp_path / "kernels")
    out = tmp_path / "repro.h5"
    case = "edges.r128-fp8-rope-131072"
    code, stdout, stderr = _reduce(CI_GOLDENS, "--case", case, "--kernels", kernels, "-o", out)
    assert code == ExitCode.DIVERGED, stdout + stderr
    assert "as a prefill from position 0: kept" in stderr
    before, after, fixed = _elements(stdout)
    assert "carries omitted (the contract clears them at position 0): kept" in stderr
    # ape 128x512, norm 512, seqlens_k, T, the kv of position 0 (no carry: a step from 0 omits it);
    # then one token of one head
    assert fixed == 128 * 512 + 512 + 2 + 512
    assert after == fixed + 512 + 2 * 512 + 1 and after <= before / 10
    assert "a current_kv from position 0; no carries: a step from position 0 may omit them)" in stdout
    assert f"of the {before - fixed:,} it lets vary, {after - fixed:,} remain" in stdout
    assert "verified against the oracle: yes" in stdout and "built-in kernels: pass" in stdout
    with GoldenFile(out) as golden:
        reduced = golden.read_step(f"{case}.reduced", 0).inputs
        assert golden.cleared_carries(f"{case}.reduced", 0) == ("past_compression_carry",)
    assert int(reduced["total_sequence_length"]) == 1 and reduced["past_compressed_kv"].shape == (1, 0, 583)
    assert reduced["past_compression_carry"].shape == (1, 128, 2, 512)


def test_a_prefill_from_position_0_omits_its_carries_to_under_a_quarter(tmp_path):
    """The ratio-4 case most bugs first fail in: one token from position 0 without its carries (which the
    reader hands back cleared) still diverges, 72,627 -> 9,476 input elements."""
    kernels = MUTANT["missing_sink"].apply(KERNELS, tmp_path / "kernels")
    out = tmp_path / "repro.h5"
    case = "boundaries.r4-bias-masks-whole-rows"
    code, stdout, stderr = _reduce(CI_GOLDENS, "--case", case, "--kernels", kernels, "-o", out)
    assert code == ExitCode.DIVERGED, stdout + stderr
    assert "carries omitted (the contract clears them at position 0): kept" in stderr
    before, after, fixed = _elements(stdout)
    # the two compressors' ape and norm, seqlens_k, T, the kv of position 0
    assert fixed == 4 * 1024 + 512 + 4 * 256 + 128 + 2 + 512
    # one token: query, compressor kv and gate, head_sink, index query and weight, index kv and gate
    assert (before, after) == (72_627, fixed + 512 + 2 * 1024 + 1 + 128 + 1 + 2 * 256) and after <= before / 4
    assert "verified against the oracle: yes" in stdout and "built-in kernels: pass" in stdout
    reduced = f"{case}.reduced"
    with GoldenFile(out) as golden:
        assert golden.cleared_carries(reduced, 0) == ("past_compression_carry", "past_index_carry")
    code, text = _first_divergence(out, reduced, kernels)
    assert code == ExitCode.DIVERGED and "stage sparse_sink_softmax_attention" in text.splitlines()[0]


def test_a_record_bug_restarts_from_position_0_with_its_block_phase_and_no_carries(tmp_path):
    """A bug in the index key record needs a block end: the resumed token restarts from position 0 after
    the positions before it in its block, carries omitted: four tokens of one head and index head."""
    kernels = MUTANT["fp4_nibbles_high_first"].apply(KERNELS, tmp_path / "kernels")
    out = tmp_path / "repro.h5"
    code, stdout, stderr = _reduce(CI_GOLDENS, "--case", "boundaries.r4-bias-masks-whole-rows", "--kernels", kernels,
                                   "-o", out)
    assert code == ExitCode.DIVERGED, stdout + stderr
    assert "positions before it as a prefill from position 0 (its phase kept), carries omitted: kept" in stderr
    assert "still diverges first at index_key_update/present_index_key" in stdout
    before, after, fixed = _elements(stdout)
    token = 512 + 512 + 2 * 1024 + 128 + 1 + 2 * 256  # query, kv, compressor kv and gate, index inputs
    assert fixed == 4 * 1024 + 512 + 4 * 256 + 128 + 2 + 4 * 512 and (before, after) == (72_627, fixed + 4 * token + 1
                                                                                        - 4 * 512)
    assert "verified against the oracle: yes" in stdout and "built-in kernels: pass" in stdout
    with GoldenFile(out) as golden:
        inputs = golden.read_step("boundaries.r4-bias-masks-whole-rows.reduced", 0).inputs
    assert int(inputs["total_sequence_length"]) == 4 and inputs["query"].shape == (1, 4, 1, 512)


def test_a_bug_that_reads_the_carry_it_should_clear_keeps_the_carries(tmp_path):
    """Omitting the carries hands the kernel cleared ones, which hides this bug: reduce keeps the stale
    ones the ci case stores."""
    kernels = MUTANT["carry_not_cleared_at_position_0"].apply(KERNELS, tmp_path / "kernels")
    out = tmp_path / "repro.h5"
    code, stdout, stderr = _reduce(CI_GOLDENS, "--case", "boundaries.r4-prefill-5", "--kernels", kernels, "-o", out)
    assert code == ExitCode.DIVERGED, stdout + stderr
    assert "carries omitted (the contract clears them at position 0): lost the divergence" in stderr
    assert "still diverges first at compression_update/" in stdout and "built-in kernels: pass" in stdout
    with GoldenFile(out) as golden:
        assert golden.cleared_carries("boundaries.r4-prefill-5.reduced", 0) == ()
        inputs = golden.read_step("boundaries.r4-prefill-5.reduced", 0).inputs
    assert all(np.isfinite(inputs[name]).all() for name in CARRIES)


def test_without_a_case_the_smallest_diverging_cases_are_reduced_and_the_smallest_kept(tmp_path):
    kernels = MUTANT["missing_sink"].apply(KERNELS, tmp_path / "kernels")
    out = tmp_path / "repro.h5"
    code, stdout, stderr = _reduce(CI_GOLDENS, "--kernels", kernels, "-o", out, "--budget-s", "60")
    assert code == ExitCode.DIVERGED, stdout + stderr
    found = re.search(r"smallest repro from (\S+): (\d) diverging of (\d+) cases probed", stdout)
    assert found and int(found.group(2)) == 3
    assert "reduce: 3 diverging of " in stderr
    assert "verified against the oracle: yes" in stdout and "built-in kernels: pass" in stdout
    with GoldenFile(out) as golden:
        assert golden.case_ids() == [f"{found.group(1)}.reduced"]
    before, after, fixed = _elements(stdout)
    assert after == fixed + 3714 - 512  # one token of one head and one index head at ratio 4
    # prefill-1, -3 and -4 all reduce to that one token: the repro kept is the one under a quarter of its case
    assert found.group(1) == "boundaries.r4-prefill-4" and 4 * after <= before


def test_without_a_case_a_repro_over_a_quarter_of_its_case_is_looked_for_in_larger_cases(tmp_path):
    """prefill-1 and -3 reduce to one token (9,476 elements, over a quarter of either) and prefill-4 to a
    record's four: the smallest diverging case of four times that repro's size reduces as small."""
    kernels = MUTANT["fp4_nibbles_high_first"].apply(KERNELS, tmp_path / "kernels")
    code, stdout, stderr = _reduce(CI_GOLDENS, "--kernels", kernels, "-o", tmp_path / "repro.h5", "--budget-s", "90")
    assert code == ExitCode.DIVERGED, stdout + stderr
    assert "boundaries.r4-prefill-1 30,085 -> 9,476, boundaries.r4-prefill-3 37,769 -> 9,476" in stdout
    assert "input elements, at least four times the smallest repro)" in stderr
    before, after, _ = _elements(stdout)
    assert after == 9_476 and before >= 4 * after and "smallest repro from boundaries.r4-prefill" not in stdout


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
    # omitted carries are those of a step from position 0 only: resumed at 4, the carries are stored again
    assert prefill.start == 0 and without_carries(prefill).elements() == prefill.elements() - 8 * 2 * (1024 + 256)
    assert later_tokens(without_carries(prefill), 4).elements() == later.elements()
    resumed = later.case("x", "")
    whole = prefill.case("x", "")
    # the resumed suffix ends in the state the whole prefill ends in
    for name in ("present_compressed_kv", "present_index_key"):
        assert np.array_equal(resumed.steps[0].outputs[name], whole.steps[0].outputs[name])


def test_restarts_and_fewer_past_records_give_streams_the_oracle_accepts():
    with GoldenFile(CI_GOLDENS) as golden:
        resumed = stream_of(golden, "edges.r4-n8-i5-k5")
        biased = stream_of(golden, "random.r4-bias-BNSC")
    records = int(resumed.steps[0]["past_compressed_kv"].shape[1])
    # the ape and norm of both compressors, the carries, the 6 records (FP8, 583 bytes) and index keys (FP4,
    # 68 bytes) its position 24 holds, the cursors
    assert records == 6 and resumed.fixed_elements() == (4 * 1024 + 512 + 4 * 256 + 128 + 8 * 2 * 1024 + 8 * 2 * 256
                                                          + 6 * 583 + 6 * 68 + 2)
    assert resumed.window_floor() == (0, 26 * 512)  # start 24, S 2: the dense window reaches position 0
    fewer = past_records(resumed, 1)
    assert fewer.start == resumed.start - 4 * (records - 1)
    assert fewer.steps[0]["past_index_key"].shape[1] == 1 and fewer.case("x", "") is not None
    alone = restarted(resumed, 0, 1)
    assert (alone.start, alone.tokens, int(alone.steps[0]["current_kv"].shape[1])) == (0, 1, 1)
    assert alone.case("x", "") is not None
    # from position 0 the carries are no longer fixed, and omitting them stores none of their elements
    assert alone.fixed_elements() == 4 * 1024 + 512 + 4 * 256 + 128 + 2
    assert without_carries(resumed) is None
    omitted = without_carries(alone)
    assert omitted.elements() == alone.elements() - 8 * 2 * 1024 - 8 * 2 * 256 and without_carries(omitted) is None
    assert CARRIES[0] not in omitted.case("x", "").steps[0].inputs
    assert omitted.case("x", "").steps[0].outputs.keys() == alone.case("x", "").steps[0].outputs.keys()
    # a bias with a candidate axis follows the candidate count the edit leaves (130 -> 128 + 1, then 1:
    # one dense slot and no record at position 0)
    assert fitted(past_records(biased, 0)).steps[0]["attention_bias"].shape == (2, 2, 2, 128 + 1)
    moved = fitted(restarted(biased, 1, 1))
    assert moved.steps[0]["attention_bias"].shape == (2, 2, 1, 1)
    assert moved.case("x", "") is not None and restarted(biased, 1, 1).case("x", "") is None
    assert "attention_bias" not in without_bias(biased).steps[0] and without_bias(biased).case("x", "") is not None
