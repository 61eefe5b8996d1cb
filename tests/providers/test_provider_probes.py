"""A provider's sub-step probes (specs/providers.md, "Probes"): the NumPy example shows the oracle's own
intermediates, a bug planted inside a stage is located at its sub-step with every probe before it equal, and
what is no probe is a defect line of the explanation, never a verdict."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from csa_conform.check.results import schema
from csa_conform.cli import main
from csa_conform.contract import validate_step
from csa_conform.device.provider import load_provider
from csa_conform.device.runner import DeviceRunner
from csa_conform.exitcodes import ExitCode
from csa_conform.explain.probes import PAYLOAD_FIRST, PROBED, defect_text, probe_claim, probe_step, probe_text, \
    probed_launches
from csa_conform.golden import GoldenFile
from csa_conform.spec import STAGE_NAMES, Mode

ROOT = Path(__file__).resolve().parents[2]
CI = ROOT / "goldens" / "ci.h5"
NUMPY = f"python:{ROOT / 'examples' / 'providers' / 'numpy_oracle.py'}:NumpyOracle"
PLANTED = Path(__file__).with_name("planted.py")
PREFILL = "boundaries.r4-prefill-8"  # ratio 4 from position 0: main and index records, index queries
COMPRESSION = ("compression_update",)


def planted(name: str) -> str:
    return f"python:{PLANTED}:{name}"


def observed(spec: str, case: str, index: int = 0, stages=tuple(PROBED)) -> dict:
    """The probe observations of ``stages`` on the provider, as explain makes them (the unprobed isolated run
    keeps on the provider only the calls of the probed stages)."""
    provider = load_provider(spec)
    with GoldenFile(CI) as golden:
        info, step = golden.case_info(case), golden.read_step(case, index)
        g = validate_step(info.attrs, step.inputs, info.output_names)
        calls = [call.stages for call in provider.calls(g.ratio)]
        host = frozenset(STAGE_NAMES) - probed_launches(g.ratio, stages, calls)
        unprobed = DeviceRunner(provider=provider, mode=Mode.ISOLATED, force_host=host).run_step(
            info.attrs, step.inputs, info.output_names, reference=step.stages)
        return probe_step(DeviceRunner(provider=provider, mode=Mode.ISOLATED), info.attrs, info.output_names,
                          step.inputs, step.stages, unprobed.stages, g, list(stages))


def statuses(observation: dict) -> dict[str, str]:
    return {probe["name"]: probe["status"] for probe in observation["probes"]}


@pytest.mark.parametrize("case", [PREFILL, "edges.r128-f32-ties-b2n3"])
def test_the_numpy_example_shows_every_intermediate_the_oracle_captures(case):
    observations = observed(NUMPY, case)
    assert observations
    for stage, observation in observations.items():
        assert observation["module"] == f"numpy-oracle.{stage}" and observation["trusted"], observation
        assert not observation["defects"] and observation["first_divergent"] is None, probe_text(observation)
        first = [PAYLOAD_FIRST[stage][0]] if stage in PAYLOAD_FIRST else []
        assert statuses(observation) == dict.fromkeys(first + list(PROBED[stage]), "equal"), observation
        assert all(probe["elements"] > 0 for probe in observation["probes"])


def test_a_bug_planted_in_a_providers_rmsnorm_is_observed_at_rmsnorm():
    observation = observed(planted("RmsNormWeightOff"), PREFILL, stages=COMPRESSION)["compression_update"]
    seen = statuses(observation)
    assert observation["first_divergent"] == "RMSNorm" and observation["exact"] and observation["trusted"]
    assert [seen[name] for name in ("pool_scores", "pooled", "bf16", "rmsnorm")] == ["equal"] * 3 + ["differs"]
    assert probe_text(observation).startswith(
        "probe: the first divergent sub-step is RMSNorm — gate + APE scores, pool, bf16 equal; RMSNorm: 2 of 1,024 "
        "elements differ, first at b=0, record=0, d=4: reference 0.98046875 (0x3f7b0000), device 1.9609375")
    assert probe_claim(observation).detail == {"sub_step": "RMSNorm", "exact": True}


def test_what_is_no_probe_is_a_defect_line_and_the_rest_is_compared():
    observation = observed(planted("ProbesAmiss"), PREFILL, stages=COMPRESSION)["compression_update"]
    where = "probes-amiss.compression_update"
    assert defect_text(observation) == [
        f"probe defect of the provider: {where} called probe with the name 7, not a string",
        f"probe defect of the provider: {where}'s probe 'softmax_max' is a object, not an array (DLPack, CUDA "
        "array interface or __array__)",
        f"probe defect of the provider: {where} called probe('hadamard'), no probe of compression_update (those "
        "are pool_scores, pooled, bf16, rmsnorm, rope, fp8_scale, fp8_codes)",
        f"probe defect of the provider: {where}'s probe 'rmsnorm' is float32[2, 512], not the reference's "
        "float32[1, 2, 512]"]
    rmsnorm = next(probe for probe in observation["probes"] if probe["name"] == "rmsnorm")
    assert rmsnorm["status"] == "unobserved" and "float32[2, 512], not float32[1, 2, 512]" in rmsnorm["reason"]
    assert statuses(observation)["bf16"] == "equal" and observation["trusted"] and not observation["exact"]
    assert observation["unobserved_before"] == ["RMSNorm"]


def test_a_probed_call_that_changes_its_payload_is_not_trusted():
    observation = observed(planted("ProbingMovesBytes"), PREFILL, stages=COMPRESSION)["compression_update"]
    assert observation["moved"] == ["compression_update/logical_records"] and not observation["trusted"]
    assert probe_text(observation) == (
        "probes not trusted: the probed call changed the provider's own payloads (compression_update/logical_records), "
        "so its intermediates need not be the unprobed call's")
    assert probe_claim(observation) is None


def test_a_provider_that_takes_no_probe_has_no_probes_and_says_so():
    observation = observed(planted("RmsNormWeightOffUnprobed"), PREFILL, stages=COMPRESSION)["compression_update"]
    assert probe_text(observation) == (
        "probes: none observed (gate + APE scores, pool, bf16, RMSNorm, RoPE, FP8 block scale, FP8 codes: "
        "planted-rmsnorm-unprobed.compression_update takes no probe argument)")
    assert probe_claim(observation) is None and not observation["defects"]


def test_explain_leads_with_the_sub_step_a_providers_probes_observed():
    result = CliRunner().invoke(main, ["explain", str(CI), "--case", PREFILL, "--stage", "compression_update",
                                       "--kernels", planted("ProbesAmiss"), "--json"])
    assert result.exit_code == ExitCode.DIVERGED, result.output
    document = json.loads(result.stdout)
    jsonschema.validate(document, schema())
    [explanation] = document["explain"]["explanations"]
    assert explanation["probe"]["module"] == "probes-amiss.compression_update"
    assert len(explanation["probe"]["defects"]) == 4
    text = CliRunner().invoke(main, ["explain", str(CI), "--case", PREFILL, "--stage", "compression_update",
                                     "--kernels", planted("RmsNormWeightOff")]).output
    headline = next(line for line in text.splitlines() if "step 0 compression_update" in line)
    assert ": unexplained: sub-step: the first sub-step whose probed output differs on the device is RMSNorm (probes: " in headline


def test_the_protocol_gives_the_layout_of_every_probe_explain_compares():
    text = (ROOT / "specs" / "providers.md").read_text().split("| probe | compressors", 1)[1].split("\n\n", 1)[0]
    documented = {name for row in text.splitlines()[2:] for name in re.findall(r"`(\w+)`", row.split("|")[1])}
    assert documented == {name for names in PROBED.values() for name in names}


def test_the_torch_example_tells_the_sink_left_out_by_its_denominator():
    pytest.importorskip("torch", reason="torch is not installed (pip install 'csa-conform[torch]')")
    example = ROOT / "examples" / "providers" / "torch_official.py"
    stage = "sparse_sink_softmax_attention"
    observation = observed(f"python:{example}:TorchOfficialWithoutSink", "random.r4-n4-i3-k1", stages=(stage,))[stage]
    # its online softmax never forms the reference's per-slot probabilities, so it shows none
    assert statuses(observation) == {"logits": "equal", "softmax_max": "equal", "softmax_denominator": "differs",
                                     "softmax_probabilities": "unobserved"}
    assert observation["trusted"] and observation["exact"] and not observation["defects"]
