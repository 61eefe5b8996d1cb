"""The provider protocol (specs/providers.md): any Python object judged stage by stage like kernels."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from click.testing import CliRunner

from csa_conform.check.options import BuildChoice, RunOptions
from csa_conform.check.results import schema
from csa_conform.cli import main
from csa_conform.device.provider import GROUPS, UPSTREAM, load_provider
from csa_conform.exitcodes import ExitCode
from csa_conform.golden import GoldenFile
from csa_conform.oracle.stage_functions import STAGE_FUNCTIONS
from csa_conform.spec import STAGE_NAMES, Mode

ROOT = Path(__file__).resolve().parents[2]
CI = str(ROOT / "goldens" / "ci.h5")
NUMPY = f"python:{ROOT / 'examples' / 'providers' / 'numpy_oracle.py'}:NumpyOracle"
PLANTED = Path(__file__).with_name("planted.py")


def planted(name: str) -> str:
    return f"python:{PLANTED}:{name}"


def diff(*args: str):
    result = CliRunner().invoke(main, ["diff", CI, *args])
    return result


def document(*args: str) -> dict:
    result = diff(*args, "--json")
    assert result.exit_code in (0, 1), result.output
    doc = json.loads(result.stdout)
    jsonschema.validate(doc, schema())
    return doc


def stage_statuses(doc: dict) -> dict[str, set[str]]:
    """Per stage, the statuses it got over the document's cases."""
    seen: dict[str, set[str]] = {}
    for case in doc["cases"]:
        for stage, status in case["verdicts"].items():
            seen.setdefault(stage, set()).add(status)
    return seen


def first_stages(doc: dict) -> set[str]:
    """The stage each failing case's first divergent step names first."""
    return {case["steps"][0]["stages"][0]["stage"] for case in doc["cases"] if not case["passed"]}


def test_the_numpy_provider_is_conformant_on_every_ci_case():
    with GoldenFile(CI) as golden:
        cases = len(golden.case_ids())
    result = diff("--kernels", NUMPY, "-q")
    assert result.exit_code == 0, result.output
    assert f"{cases} cases" in result.output and f"{cases} conformant, 0 diverged" in result.output


@pytest.mark.parametrize("mode", ["chained", "isolated"])
def test_a_provider_that_changes_one_stage_is_caught_at_that_stage(mode):
    doc = document("--kernels", planted("ScoresOneUlpHigh"), "--mode", mode, "--case", "random.r4-*")
    assert doc["exit_code"] == 1
    assert first_stages(doc) == {"index_scoring"}
    kernels = {entry.get("kernel") for case in doc["cases"] for step in case["steps"] for entry in step["stages"]}
    assert kernels == {"planted-score.index_scoring"}
    statuses = stage_statuses(doc)
    for stage in ("compression_update", "index_key_update", "index_query_finalize"):
        assert statuses[stage] == {"identical"}
    assert "diverged" in statuses["index_scoring"]
    if mode == "isolated":  # every other stage is fed the oracle's payloads, so only scoring diverges
        assert all(statuses[stage] == {"identical"} for stage in STAGE_NAMES if stage != "index_scoring")


def test_stages_a_provider_lacks_run_on_the_host_oracle_and_the_header_says_so():
    result = diff("--kernels", planted("AttentionOnly"), "--case", "random.r4-n4-i3-k1")
    assert result.exit_code == 0, result.output
    assert ("provider attention-only " in result.output and "not provided, so run on the host oracle: "
            "compression_update, index_key_update, index_query_finalize, index_scoring, selection, "
            "candidate_assembly, writeback" in result.output)
    doc = document("--kernels", planted("AttentionOnly"), "--case", "random.r4-n4-i3-k1")
    launches = {(launch["path"], launch["module"], tuple(launch["stages"])) for launch in doc["kernels"]["launches"]}
    assert ("python", "attention-only", ("sparse_sink_softmax_attention",)) in launches
    assert ("host-oracle", "csa_conform.oracle.selection", ("selection",)) in launches
    assert doc["control_run"] is False


def test_a_fused_call_computes_its_stages_in_one_call():
    provider = load_provider(planted("FusedIndexSelect"))
    assert [(call.module, call.stages) for call in provider.calls(4)] == [
        ("index_select", GROUPS["index_select"]), ("sparse_sink_softmax_attention", ("sparse_sink_softmax_attention",))]
    assert provider.calls(128) == provider.calls(4)[1:]
    doc = document("--kernels", planted("FusedIndexSelect"), "--case", "random.r4-*", "--mode", "isolated")
    assert doc["exit_code"] == 0
    calls = [launch for launch in doc["kernels"]["launches"] if launch["path"] == "python"]
    assert {launch["module"] for launch in calls} == {"fused-index-select"}
    assert {tuple(launch["stages"]) for launch in calls} >= {GROUPS["index_select"]}


def test_force_host_moves_a_provided_stage_to_the_oracle():
    doc = document("--kernels", planted("ScoresOneUlpHigh"), "--force-host", "score", "--case", "random.r4-*")
    assert doc["exit_code"] == 0
    assert doc["options"]["force_host"] == ["index_scoring"]


def test_repeat_calls_every_stage_again_and_reports_what_changed():
    doc = document("--kernels", planted("FlakyAttention"), "--repeat", "2", "--case", "random.r4-n4-i3-k1")
    assert doc["exit_code"] == 1
    assert doc["cases"][0]["verdicts"]["sparse_sink_softmax_attention"] == "non-deterministic"
    finding = doc["cases"][0]["steps"][0]["findings"][0]
    assert finding["type"] == "non-deterministic" and finding["module"] == "flaky"
    assert "sparse_sink_softmax_attention" in finding["message"] and "(Y)" in finding["message"]


def test_a_provider_that_raises_gets_a_verdict_at_its_stage():
    doc = document("--kernels", planted("Raising"), "--case", "random.r4-n4-i3-k1")
    assert doc["exit_code"] == 1
    assert doc["cases"][0]["verdicts"]["selection"] == "diverged"
    assert "raising.selection raised RuntimeError: out of shared memory" in json.dumps(doc["cases"][0])


@pytest.mark.parametrize(("spec", "words"), [
    ("python:no_such_module_here:X", "no module named 'no_such_module_here'"),
    (f"python:{PLANTED}:Nothing", "has no 'Nothing'"),
    ("python:nowhere/file.py:X", "no file nowhere/file.py"),
    ("python:justone", "a provider is python:MODULE:OBJECT"),
    (f"python:{PLANTED}:Undeclared", "declares no version"),
])
def test_a_provider_that_cannot_be_loaded_is_one_line(spec, words):
    result = diff("--kernels", spec)
    assert result.exit_code == ExitCode.USAGE
    assert words in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("words", [["--build", "strict"], ["--nvrtc-option=-DX"], ["--strict-ptx"],
                                   ["--backend", "host"], ["--replay", "graph"], ["--sanitize", "memcheck"]])
def test_what_only_applies_to_a_kernel_directory_is_refused_in_one_line(words):
    result = diff("--kernels", NUMPY, *words)
    assert result.exit_code == ExitCode.USAGE, result.output
    assert result.output.count("\n") == 1 and "python: provider" in result.output


class _Recorder:
    """A stage function's StageInputs that records which upstream payloads it reads."""

    def __init__(self, geometry, reference):
        self.geometry, self.reference, self.read = geometry, reference, []
        from csa_conform.oracle.engine import resolve_engine

        self.engine = resolve_engine()

    def input(self, name):
        return self.inputs[name]

    def upstream(self, stage, tensor):
        self.read.append((stage, tensor))
        return self.reference[stage][tensor]

    def row_failure(self, stage, failure):
        assert failure is None

    def prior_failure(self, stage):
        return None


@pytest.mark.parametrize("case", ["random.r4-n4-i3-k1", "edges.r128-fp8-b2n5-sinks"])
def test_the_upstream_a_provider_is_given_is_what_the_oracle_reads(case):
    from csa_conform.contract import validate_step

    with GoldenFile(CI) as golden:
        info, step = golden.case_info(case), golden.read_step(case, 0)
    geometry = validate_step(info.attrs, step.inputs, info.output_names)
    for stage, function in STAGE_FUNCTIONS.items():
        if stage not in step.stages and stage != "writeback":
            continue
        recorder = _Recorder(geometry, step.stages)
        recorder.inputs = step.inputs
        function(recorder)
        expected = {(up, tensor) for up, tensor in UPSTREAM[stage] if up in step.stages}
        assert set(recorder.read) == expected, stage


def test_run_options_make_a_provider_runner_that_keeps_the_mode():
    options = RunOptions(file=CI, mode=Mode.ISOLATED, force_host=frozenset(), ulp=0,
                         build=BuildChoice(kernels=NUMPY))
    runner = options.runner()
    assert runner.provider is not None and runner.mode is Mode.ISOLATED
    assert runner.plan(128).launches == load_provider(NUMPY).calls(128)
    assert np.array_equal([stage.placement for stage in runner.plan(4).stages], ["device"] * 8)


def test_invariance_runs_the_variants_on_the_provider():
    plain = document("--kernels", planted("BatchVariantAttention"), "--case", "random.r4-n4-i3-k1")
    assert plain["exit_code"] == 0
    varied = document("--kernels", planted("BatchVariantAttention"), "--case", "random.r4-n4-i3-k1",
                      "--invariance", "batch")
    assert varied["exit_code"] == 1
    assert varied["cases"][0]["verdicts"]["sparse_sink_softmax_attention"] == "batch-variant"


def test_shards_and_devices_split_the_cases_and_join_to_the_whole_run():
    whole = document("--kernels", NUMPY, "--case", "random.r4-b*")
    shards = [document("--kernels", NUMPY, "--case", "random.r4-b*", "--shard", f"{k}/2") for k in (1, 2)]
    assert sorted(case["case"] for doc in shards for case in doc["cases"]) == [case["case"] for case in whole["cases"]]
    spread = document("--kernels", NUMPY, "--case", "random.r4-b*", "--devices", "0,1")
    assert [case["verdicts"] for case in spread["cases"]] == [case["verdicts"] for case in whole["cases"]]
    assert spread["exit_code"] == whole["exit_code"] == 0
