"""`explain` on the host emulation: each numerics variant of the project's kernels, a compile-time
switch, is flagged by diff at its stage and named by explain. The host's stand-in for the platform
libm is correctly rounded ((float)f((double)x), csa_conform/device/host/cuda_host_shim.h), and the device-libm
hypotheses are skipped with their reason."""

from __future__ import annotations

import fnmatch
import json
import sys
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from click.testing import CliRunner

from csa_conform.check.results import schema
from csa_conform.cli.diff import diff
from csa_conform.cli.explain import explain_command
from csa_conform.contract import validate_step
from csa_conform.device.kernels import KernelDirectory
from csa_conform.exitcodes import ExitCode
from csa_conform.explain import EXPLAINED, INHERITED, UNEXPLAINED, explain_cases
from csa_conform.explain.element import element_provenance
from csa_conform.explain.stages import run_stage
from csa_conform.golden import GoldenFile
from csa_conform.numerics.fp8 import e4m3_decode
from csa_conform.numerics.variant import Numerics

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels_mutants"))
from mutants import MUTANTS  # noqa: E402

KERNELS = Path(__file__).resolve().parents[2] / "kernels"

pytestmark = pytest.mark.usefixtures("emulated_cuda")


def _explain(path, directory: KernelDirectory, pattern: str = "*"):
    with GoldenFile(path) as golden:
        cases = [case for case in golden.case_ids() if fnmatch.fnmatchcase(case, pattern)]
        return explain_cases(golden, cases, directory)


def _isolated_stages(path, *options) -> set[str]:
    result = CliRunner().invoke(diff, [str(path), "--mode", "isolated", "--json", *options])
    document = json.loads(result.stdout)
    return {stage for case in document["cases"] for stage, verdict in case["verdicts"].items()
            if verdict == "diverged"}


def test_strict_builtin_kernels_have_nothing_to_explain(variant_goldens):
    result = CliRunner().invoke(explain_command, [str(variant_goldens)])
    assert result.exit_code == ExitCode.OK, result.output
    assert result.output.splitlines()[-1] == "0 divergences: 0 explained, 0 ambiguous, 0 inherited, 0 unexplained"


def test_platform_libm_switch_is_flagged_at_attention_and_named_expf_correctly_rounded(variant_goldens):
    option = "--nvrtc-option=-DCSA_LIBM_PLATFORM"
    assert _isolated_stages(variant_goldens, option) == {"sparse_sink_softmax_attention"}
    explanations = _explain(variant_goldens, KernelDirectory(nvrtc_options=("-DCSA_LIBM_PLATFORM",)))
    located = [e for e in explanations if e.verdict != INHERITED]
    assert located and all(e.stage == "sparse_sink_softmax_attention" for e in located)
    for explanation in located:
        assert explanation.verdict == EXPLAINED and explanation.cause.key == "expf:correctly-rounded"
        changed, seen = explanation.cause.changed["expf"]
        assert 0 < changed < seen
        assert "device libm" in explanation.skipped and "correctly rounded" in explanation.skipped["device libm"]
        assert "reproduces Y bit for bit" in explanation.headline()
    inherited = {e.stage for e in explanations if e.verdict == INHERITED}
    assert inherited == {"writeback"}


CONTRACTIBLE = KernelDirectory(build="production", nvrtc_options=("-DCSA_CONTRACTIBLE",))


def test_production_build_of_plain_products_is_named_fma_accumulation(variant_goldens):
    stages = _isolated_stages(variant_goldens, "--build", "production", "--nvrtc-option=-DCSA_CONTRACTIBLE")
    assert "sparse_sink_softmax_attention" in stages
    explanations = _explain(variant_goldens, CONTRACTIBLE, "random.r4-5out*")
    causes = {(e.stage, e.verdict, e.cause.key if e.cause else None) for e in explanations}
    assert ("sparse_sink_softmax_attention", EXPLAINED, "fma:accumulate") in causes
    assert all(e.verdict in (EXPLAINED, INHERITED) for e in explanations), [e.headline() for e in explanations]


def test_flush_to_zero_is_flagged_where_subnormals_arise_and_named(variant_goldens):
    stages = _isolated_stages(variant_goldens, "--nvrtc-option=--ftz=true")
    assert "compression_update" in stages
    explanations = [e for e in _explain(variant_goldens, KernelDirectory(nvrtc_options=("--ftz=true",)))
                    if e.verdict != INHERITED]
    assert explanations and all(e.verdict == EXPLAINED and e.cause.key == "ftz" for e in explanations)
    record = next(e for e in explanations if e.stage == "compression_update")
    assert record.cause.changed["subnormal"][0] > 0
    first = record.first
    assert first["tensor"] in ("present_compressed_kv", "logical_records") and "pooled_positions" in first


def test_block_scale_switch_changes_no_exponent_with_the_host_stand_in(variant_goldens):
    assert _isolated_stages(variant_goldens, "--nvrtc-option=-DCSA_BLOCK_SCALE_PLATFORM_LOG2F") == set()


def test_first_element_provenance_of_y_lists_the_candidates_it_mixes(variant_goldens):
    explanation = next(e for e in _explain(variant_goldens, CONTRACTIBLE, "random.r4-5out*")
                       if e.stage == "sparse_sink_softmax_attention")
    first = explanation.first
    assert first["tensor"] == "Y" and first["valid_candidates"] >= len(first["candidates"]) > 0
    with GoldenFile(variant_goldens) as golden:
        step = golden.read_step(explanation.case, explanation.step)
    b, s, h, _ = (int(part.split("=")[1]) for part in first["coords"].split())
    ids = step.stages["candidate_assembly"]["candidates"][b, s]
    scores = step.stages["sparse_sink_softmax_attention"]["scores"][b, s, h]
    for candidate in first["candidates"]:
        assert ids[candidate["slot"]] == candidate["id"]
        assert np.float32(scores[candidate["slot"]]) == np.float32(candidate["score"])
    weights = [candidate["weight"] for candidate in first["candidates"]]
    assert weights == sorted(weights, reverse=True) and 0 < sum(weights) <= 1


def test_json_and_diff_explain(variant_goldens):
    args = [str(variant_goldens), "--case", "boundaries.r4-prefill-7", "--nvrtc-option=-DCSA_LIBM_PLATFORM"]
    result = CliRunner().invoke(explain_command, args + ["--json"])
    document = json.loads(result.stdout)
    jsonschema.validate(document, schema())
    assert document["command"] == "explain" and document["exit_code"] == ExitCode.DIVERGED
    assert document["options"]["nvrtc_options"] == ["-DCSA_LIBM_PLATFORM"]
    assert all("-DCSA_LIBM_PLATFORM" in module["options"] for module in document["kernels"]["modules"].values())
    explained = document["explain"]
    assert explained["summary"]["divergences"] == len(explained["explanations"]) > 0
    verdicts = {e["stage"]: e for e in explained["explanations"]}
    attention = verdicts["sparse_sink_softmax_attention"]
    assert attention["verdict"] == EXPLAINED and attention["cause"]["reproduces"]
    assert attention["first_element"]["tensor"] == "Y" and attention["trials"]
    text = CliRunner().invoke(explain_command, args).output
    assert text.count("build strict (default for the built-in kernels)") == 1
    assert "EXPLANATIONS" in text and "explained: expf correctly rounded" in text
    text = CliRunner().invoke(diff, args + ["--explain"]).output
    assert "EXPLANATIONS" in text and "explained: expf correctly rounded" in text
    with_json = json.loads(CliRunner().invoke(diff, args + ["--explain", "--json"]).stdout)
    jsonschema.validate(with_json, schema())
    assert [e["verdict"] for e in with_json["explain"]["explanations"]] == [
        e["verdict"] for e in explained["explanations"]]
    assert "--nvrtc-option=-DCSA_LIBM_PLATFORM" in with_json["cases"][0]["reproduce"]


def test_a_real_bug_is_unexplained_and_closest_only_when_it_reduced_the_mismatches(variant_goldens, tmp_path):
    """A kernel that forgets the sink is no numerics variant: nothing reproduces it, and a hypothesis is
    called closest only when it left fewer elements differing than the reference's own arithmetic."""
    sink = next(mutant for mutant in MUTANTS if mutant.name == "missing_sink")
    kernels = KernelDirectory(sink.apply(KERNELS, tmp_path / "kernels"))
    explanation = next(e for e in _explain(variant_goldens, kernels, "boundaries.r4-prefill-7")
                       if e.stage == "sparse_sink_softmax_attention")
    assert explanation.verdict == UNEXPLAINED and explanation.cause is None
    assert explanation.kernel == "csa_ratio4_attention.cu:csa_ratio4_sink_attention"
    assert explanation.baseline == sum(int(line.split(": ")[1].split("/")[0]) for line in explanation.summary)
    assert explanation.trials and all(trial.mismatches > 0 for trial in explanation.trials)
    if explanation.closest is None:
        assert all(trial.mismatches >= explanation.baseline for trial in explanation.trials if not trial.rejected)
        assert "no numeric ingredient moves the result" in explanation.headline()
    else:
        assert explanation.closest.mismatches < explanation.baseline
        assert (f"closest: {explanation.closest.name} reduces the differing elements from "
                f"{explanation.baseline:,} to {explanation.closest.mismatches:,}") in explanation.headline()


def test_record_byte_provenance_matches_the_golden_bytes(variant_goldens):
    """An FP8 code byte: its block's scale byte is the exponent reported, the pre-rounding value is the
    input over that power of two, and the code the golden stores decodes to one of the bracketing values."""
    with GoldenFile(variant_goldens) as golden:
        case = next(case for case in golden.case_ids() if case.startswith("quant-edge.r128"))
        info, step = golden.case_info(case), golden.read_step(case, 0)
    g = validate_step(info.attrs, step.inputs, info.output_names)
    trace: dict = {}
    run_stage("compression_update", g, step.inputs, step.stages, Numerics(trace=trace))
    packed = step.stages["compression_update"]["present_compressed_kv"][0, 0]
    for byte in (65 * 2 + 6, 65 * 6 + 64):
        found = element_provenance("compression_update", "present_compressed_kv", (0, 0, byte), g, step.inputs,
                                   step.stages, trace)
        block = found["block"]
        assert found["fp8_block"] == byte // 65 and found["d"] == 64 * (byte // 65) + byte % 65 - 1
        assert packed[65 * found["fp8_block"]] == block["scale_exponent"] + 127
        assert np.float32(block["pre_rounding"]) == np.float32(
            np.float32(block["input"]) / np.float32(2.0 ** block["scale_exponent"]))
        assert abs(float(e4m3_decode(packed[byte]))) in block["between"]
    tail = element_provenance("compression_update", "present_compressed_kv", (0, 0, 457), g, step.inputs,
                              step.stages, trace)
    assert tail["part"] == "bf16 low byte of d=449" and tail["rope_tail"] and tail["rope_pair"] == 0
    assert "block" not in tail
