"""Input ablation on the host emulation: a bug that reads the attention bias of head 0 for every head
vanishes with a zero bias and with one head, and persists with the sink's weight or the scale
neutralised; the facts reach the text and the results document."""

from __future__ import annotations

import shutil
from pathlib import Path

import jsonschema
import pytest

from csa_conform.check.results import schema
from csa_conform.device.kernels import KernelDirectory
from csa_conform.explain import explain_case
from csa_conform.device.runner import DeviceRunner
from csa_conform.explain.ablation import NOT_RUN, PERSISTS, VANISHES, ablate, ablation_runner, ablation_text
from csa_conform.golden import GoldenFile
from csa_conform.spec import Mode

pytestmark = pytest.mark.usefixtures("emulated_cuda")

ROOT = Path(__file__).resolve().parents[2]
CI = ROOT / "goldens" / "ci.h5"


def _planted(directory: Path, old: str, new: str) -> KernelDirectory:
    """The built-in kernels copied to ``directory`` with one change to the prelude."""
    shutil.copytree(ROOT / "kernels", directory)
    prelude = directory / "block_quant.cuh"
    text = prelude.read_text()
    assert text.count(old) == 1
    prelude.write_text(text.replace(old, new))
    return KernelDirectory(directory)


@pytest.fixture(scope="module")
def head_zero_bias(tmp_path_factory) -> KernelDirectory:
    return _planted(tmp_path_factory.mktemp("bias") / "kernels", "(a.bias_h == 1 ? 0 : r.head))",
                    "(a.bias_h == 1 ? 0 : 0))")


def test_a_kernel_ignoring_the_scale_attribute_vanishes_with_the_default_scale(tmp_path):
    kernels = _planted(tmp_path / "kernels", "float score = csa_mul(dot, a.scale);",
                       "float score = csa_mul(dot, 1.0f / sqrtf((float)a.dim));")
    with GoldenFile(CI) as golden:
        explanations = explain_case(golden, "edges.r128-fp8-b2-block-end-in-step-scale", kernels)
    (attention,) = [e for e in explanations if e.stage == "sparse_sink_softmax_attention"]
    outcomes = {ablation["key"]: ablation["outcome"] for ablation in attention.ablations}
    assert outcomes["scale=default"] == VANISHES and outcomes["scale=1"] == PERSISTS
    assert "vanishes with scale = 0 (the contract's default, 1/sqrt(D))" in attention.headline()


def test_a_bias_dependent_bug_vanishes_without_the_bias_and_persists_without_the_sink(head_zero_bias):
    with GoldenFile(CI) as golden:
        explanations = explain_case(golden, "random.r128-bias-BNSC", head_zero_bias)
    (attention,) = [e for e in explanations if e.stage == "sparse_sink_softmax_attention"]
    outcomes = {ablation["key"]: ablation["outcome"] for ablation in attention.ablations}
    assert outcomes["attention_bias=0"] == VANISHES and outcomes["one-head"] == VANISHES
    assert outcomes["no-sink"] == outcomes["scale=1"] == outcomes["one-row"] == PERSISTS
    assert "compressor_ape=0" not in outcomes  # it cannot move attention's result, so it is not run
    assert all(ablation["differing"] > 0 for ablation in attention.ablations if ablation["outcome"] == PERSISTS)
    lines = attention.lines()
    assert any(line.startswith("  ablation: the divergence vanishes with attention_bias = 0; with only head h=1")
               for line in lines), lines
    document = attention.to_dict()
    assert document["ablations"] == attention.ablations
    assert attention.probe["first_divergent"] == "logits" and attention.probe["exact"], attention.probe
    assert document["probe"]["probes"][0]["first"]["coords"]["h"] == 1
    explain_items = schema()["properties"]["explain"]["properties"]["explanations"]["items"]
    jsonschema.validate(document, {**explain_items, "$defs": schema()["$defs"]})


def test_an_ablation_the_step_cannot_take_is_not_run_with_its_reason():
    with GoldenFile(CI) as golden:  # one batch row, from position 0
        info = golden.case_info("boundaries.r4-prefill-8")
        step = golden.read_step("boundaries.r4-prefill-8", 0)
    runner = ablation_runner(DeviceRunner(mode=Mode.ISOLATED), 4, ["compression_update"])
    results = {result["key"]: result for result in ablate(info.attrs, info.output_names, step.inputs,
                                                          "compression_update", [], runner)}
    assert set(results) == {"compressor_ape=0", "compressor_norm=1", "position-0", "one-row"}
    assert results["position-0"] == {"key": "position-0", "change": "the same tokens as a fresh prefill from "
                                     "position 0", "outcome": NOT_RUN,
                                     "reason": "the step starts at position 0 already"}
    assert results["one-row"]["reason"] == "the step has one batch row already"
    assert results["compressor_ape=0"]["outcome"] == VANISHES  # the built-in kernels: nothing to need
    assert ablation_text(list(results.values()))[0] == (
        "ablation: the divergence vanishes with compressor_ape = 0; with compressor_norm = 1")


def test_explains_oracle_re_runs_take_the_numpy_engine_whatever_the_environment_names(monkeypatch):
    """The compiled engine gives the same bytes but first compiles its kernels where numba's cache is cold
    (about 20 s of a whole-ci explain on a fresh machine), for ci-sized re-runs it does no faster."""
    import csa_conform.device.step as step_module
    import csa_conform.oracle.pipeline as pipeline

    monkeypatch.setenv("CSA_CONFORM_ENGINE", "numba")
    asked = []
    for module in (step_module, pipeline):
        def recorded(choice=None, *args, _resolve=module.resolve_engine, **kwargs):
            asked.append(choice)
            return _resolve(choice, *args, **kwargs)
        monkeypatch.setattr(module, "resolve_engine", recorded)
    with GoldenFile(CI) as golden:
        info = golden.case_info("boundaries.r4-prefill-8")
        step = golden.read_step("boundaries.r4-prefill-8", 0)
    runner = ablation_runner(DeviceRunner(mode=Mode.ISOLATED), 4, ["compression_update"])
    results = ablate(info.attrs, info.output_names, step.inputs, "compression_update", [], runner)
    assert any(result["outcome"] == VANISHES for result in results)
    assert asked and set(asked) == {"numpy"}, asked


def test_a_carrys_divergence_is_ablated_on_a_step_that_completes_no_record(tmp_path):
    """A compressor that clears its carry whenever no record precedes the step: at a decode inside the first
    block only the carry diverges. The step completes no record but still writes the carry, so the ablations
    run, and the divergence vanishes with the same token as a fresh prefill from position 0."""
    kernels = _planted(tmp_path / "kernels", "if (first_position == 0) csa_clear_slots(state, carry_floats, width);",
                       "if (written == 0) csa_clear_slots(state, carry_floats, width);")
    with GoldenFile(CI) as golden:
        explanations = explain_case(golden, "boundaries.r4-decode-1-to-5", kernels)
    first = next(e for e in explanations if e.stage == "compression_update" and e.step == 1)
    assert {diff.split("/")[1].split(":")[0] for diff in first.summary} == {"present_compression_carry"}
    outcomes = {ablation["key"]: ablation["outcome"] for ablation in first.ablations}
    assert outcomes["position-0"] == VANISHES and outcomes["compressor_ape=0"] == PERSISTS, first.ablations


def test_a_divergence_of_a_few_elements_that_vanishes_says_it_may_be_chance():
    """Two differing elements vanish with almost any input changed: the claim says so and leans on nothing."""
    from csa_conform.explain.ablation import PERSISTS, VANISHES, ablation_claim

    results = [{"key": "compressor_norm=1", "change": "compressor_norm = 1", "outcome": VANISHES, "differing": 0},
               {"key": "one-row", "change": "only batch row b=0", "outcome": PERSISTS, "differing": 2}]
    few = ablation_claim(results, 2)
    assert few.text.endswith("(ablation: 2 inputs neutralised one at a time; the step's 2 differing elements are few "
                             "enough for any changed input to move by chance)")
    assert few.confidence == "weak"
    many = ablation_claim(results, 40)
    assert many.text.endswith("(ablation: 2 inputs neutralised one at a time)") and many.confidence == "moderate"
