"""What the items report: the oracle side always runs, the device side runs on a backend or is skipped
with its reason, and failures carry verify's and diff's diagnosis and reproduce command."""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ElementTree
from dataclasses import replace
from pathlib import Path

import h5py
import numpy as np
import pytest

from csa_conform.golden import write_goldens
from mutants import MUTANTS
from plugin_fixtures import R4_ID, R4_STAGES, R128_ID, R128_STAGES, REJECTED_ID, ci_cases, expected_ids

pytest_plugins = ("pytester",)

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
ORACLE_IDS = [node for node in expected_ids() if node.endswith("[oracle]")]
DEVICE_IDS = [node for node in expected_ids() if node.endswith("[device]")]


def outcomes(result: pytest.RunResult) -> dict[str, tuple[str, str]]:
    """nodeid -> (outcome, failure text or skip reason) of every item that ran."""
    found = {}
    for report in result.reprec.getreports("pytest_runtest_logreport"):
        if report.when == "call" or (report.when == "setup" and not report.passed):
            text = report.longrepr[2].removeprefix("Skipped: ") if report.skipped else report.longreprtext
            found[report.nodeid] = (report.outcome, text)
    return found


def statuses(result: pytest.RunResult) -> dict[str, str]:
    return {node: outcome for node, (outcome, _) in outcomes(result).items()}


def corrupt(path: Path, dataset: str) -> None:
    """Flip one bit of a dataset's data and keep its stored sha256 (a tampered file)."""
    with h5py.File(path, "r+") as handle:
        data = handle[dataset][()]
        data.reshape(-1).view(np.uint8)[0] ^= 1
        handle[dataset][...] = data


def test_without_a_device_oracle_items_pass_and_device_items_skip_with_the_reason(inner, monkeypatch):
    reason = inner.without_device(monkeypatch)
    result = inner.run()
    assert result.ret == pytest.ExitCode.OK
    found = outcomes(result)
    assert {node: found[node][0] for node in ORACLE_IDS} == dict.fromkeys(ORACLE_IDS, "passed")
    assert {node: found[node] for node in DEVICE_IDS} == dict.fromkeys(DEVICE_IDS, ("skipped", f"no device: {reason}"))
    result.stdout.fnmatch_lines(
        [f"csa-conform: 12 device items skipped: no device: {reason}", "*13 passed, 12 skipped*"]
    )


def test_on_the_emulated_device_every_item_passes_and_names_the_device(inner, emulation_backend):
    inner.emulate_device(emulation_backend)
    result = inner.run()
    assert result.ret == pytest.ExitCode.OK
    assert statuses(result) == dict.fromkeys(expected_ids(), "passed")
    result.stdout.fnmatch_lines(["csa-conform: 12 device items ran on host emulation (g++)", "*25 passed*"])


def test_each_case_is_replayed_once_per_side(inner, emulation_backend, monkeypatch):
    import csa_conform.pytest_plugin.outcomes as outcomes_module

    calls = []
    for name in ("verify_case", "check_case"):
        original = getattr(outcomes_module, name)

        def counted(path_or_golden, case_id, *args, _name=name, _original=original, **kwargs):
            calls.append((_name, case_id))
            return _original(path_or_golden, case_id, *args, **kwargs)

        monkeypatch.setattr(outcomes_module, name, counted)
    inner.emulate_device(emulation_backend)
    assert inner.run().ret == pytest.ExitCode.OK
    replays = [("verify_case", case) for case in (R4_ID, R128_ID, REJECTED_ID)]
    replays += [("check_case", R4_ID), ("check_case", R128_ID)]
    assert sorted(calls) == sorted(replays)


def test_isolated_mode_skips_writeback_on_the_device_saying_why(inner, emulation_backend):
    inner.emulate_device(emulation_backend)
    result = inner.run("--csa-mode", "isolated")
    found = outcomes(result)
    writeback = {node for node in DEVICE_IDS if "::writeback[" in node}
    assert {found[node][0] for node in writeback} == {"skipped"}
    assert all("isolated mode assembles writeback from the oracle's payloads" in found[node][1] for node in writeback)
    assert {node: found[node][0] for node in expected_ids() if node not in writeback} == dict.fromkeys(
        [node for node in expected_ids() if node not in writeback], "passed"
    )


def test_a_mutant_kernel_dir_fails_its_stage_with_diffs_diagnosis(inner, emulation_backend, tmp_path):
    mutant = next(mutant for mutant in MUTANTS if mutant.name == "index_score_without_head_normalization")
    kernels = mutant.apply(KERNELS, tmp_path / "kernels")
    inner.emulate_device(emulation_backend)
    result = inner.run(f"--csa-kernels={kernels}")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    failing = f"goldens.h5::{R4_ID}::index_scoring[device]"
    found = outcomes(result)
    assert {node for node, (outcome, _) in found.items() if outcome != "passed"} == {failing}
    text = found[failing][1]
    assert text.splitlines()[0] == f"{R4_ID} / index_scoring (step 0, device):"
    assert "  index_scoring/scores: " in text and " elements differ (max " in text and "; first at b=0 s=" in text
    assert text.splitlines()[-1] == (
        f"  reproduce: csa-conform diff goldens.h5 --stage index_scoring --mode chained --case {R4_ID} "
        f"--kernels {kernels} --build strict"
    )


@pytest.mark.parametrize(
    ("dataset", "owners"),
    [
        ("steps/0000/stages/selection/selected", {"selection"}),
        # one dataset, hard-linked as attention's Y, writeback's Y and the operator output
        ("steps/0000/outputs/Y", {"sparse_sink_softmax_attention", "writeback"}),
        ("steps/0000/inputs/query", set(R4_STAGES)),
    ],
)
def test_a_corrupt_dataset_fails_the_items_it_belongs_to_and_names_it(inner, monkeypatch, dataset, owners):
    inner.without_device(monkeypatch)
    path = f"/cases/{R4_ID}/{dataset}"
    corrupt(inner.pytester.path / inner.goldens, path)
    result = inner.run()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    found = outcomes(result)
    failing = {node for node, (outcome, _) in found.items() if outcome == "failed"}
    assert failing == {f"goldens.h5::{R4_ID}::{stage}[oracle]" for stage in owners}
    for node in failing:
        assert found[node][1].startswith(f"FAIL {R4_ID}: corrupt dataset /cases/{R4_ID}/steps/0000/")
        assert ": sha256 mismatch (stored " in found[node][1] and path in found[node][1]
        assert found[node][1].endswith(f" — reproduce: csa-conform verify goldens.h5 --case {R4_ID}")
    for stage in set(R4_STAGES) - owners:
        outcome, reason = found[f"goldens.h5::{R4_ID}::{stage}[oracle]"]
        assert outcome == "skipped" and reason.startswith("not verified: verify stops at a case's first corrupt")
        assert path in reason
    others = [node for node in ORACLE_IDS if R4_ID not in node]
    assert {found[node][0] for node in others} == {"passed"}


def test_corrupt_goldens_leave_the_device_items_uncompared_not_passed(inner, emulation_backend):
    corrupt(inner.pytester.path / inner.goldens, f"/cases/{R4_ID}/steps/0000/stages/selection/selected")
    inner.emulate_device(emulation_backend)
    found = outcomes(inner.run())
    for stage in R4_STAGES:
        outcome, reason = found[f"goldens.h5::{R4_ID}::{stage}[device]"]
        assert outcome == "skipped" and reason.startswith("not compared: the golden case cannot be read (")
        assert "selection/selected: sha256 mismatch" in reason
    assert {found[f"goldens.h5::{R128_ID}::{stage}[device]"][0] for stage in R128_STAGES} == {"passed"}


def test_x_stops_at_the_first_failure(inner, monkeypatch):
    inner.without_device(monkeypatch)
    corrupt(inner.pytester.path / inner.goldens, f"/cases/{R128_ID}/steps/0000/inputs/query")
    result = inner.run("-x")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert list(statuses(result).items()) == [(f"goldens.h5::{R128_ID}::compression_update[oracle]", "failed")]
    result.stdout.fnmatch_lines(["*stopping after 1 failures*"])


def test_junitxml_carries_every_item_its_failure_and_skip_reasons(inner, monkeypatch):
    reason = inner.without_device(monkeypatch)
    path = f"/cases/{R4_ID}/steps/0000/stages/selection/selected"
    corrupt(inner.pytester.path / inner.goldens, path)
    inner.run("--junitxml", "junit.xml")
    suite = ElementTree.parse(inner.pytester.path / "junit.xml").getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("25", "1", "19")
    cases = {f"{case.get('classname')}::{case.get('name')}": case for case in suite.iter("testcase")}
    assert set(cases) == {node.replace("goldens.h5::", "goldens.h5.", 1) for node in expected_ids()}
    failure = cases[f"goldens.h5.{R4_ID}::selection[oracle]"].find("failure")
    assert failure.get("message").startswith(f"FAIL {R4_ID}: corrupt dataset {path}: sha256 mismatch")
    assert f"reproduce: csa-conform verify goldens.h5 --case {R4_ID}" in failure.get("message")
    skip = cases[f"goldens.h5.{R128_ID}::writeback[device]"].find("skipped")
    assert skip.get("message") == f"no device: {reason}"
    properties = {prop.get("name"): prop.get("value")
                  for prop in cases[f"goldens.h5.{REJECTED_ID}::validation[oracle]"].iter("property")}
    assert properties == {"csa_case": REJECTED_ID, "csa_stage": "validation", "csa_side": "oracle"}


def test_a_kernel_dir_missing_a_module_fails_the_device_items_as_an_environment_error(
    inner, emulation_backend, tmp_path
):
    kernels = tmp_path / "kernels"
    shutil.copytree(KERNELS, kernels)
    (kernels / "csa_ratio4_index_select.cu").unlink()
    inner.emulate_device(emulation_backend)
    found = outcomes(inner.run(f"--csa-kernels={kernels}", "--csa-case", R4_ID))
    device = {node: found[node] for node in found if node.endswith("[device]")}
    assert len(device) == len(R4_STAGES) and {outcome for outcome, _ in device.values()} == {"failed"}
    text = device[f"goldens.h5::{R4_ID}::selection[device]"][1]
    assert text.startswith(f"{R4_ID} / selection: environment: kernel directory {kernels} has no "
                           "csa_ratio4_index_select.cu")
    assert text.endswith(f"reproduce: csa-conform diff goldens.h5 --stage selection --mode chained --case {R4_ID} "
                         f"--kernels {kernels} --build strict")
    assert {found[node][0] for node in found if node.endswith("[oracle]")} == {"passed"}


def test_a_stored_payload_of_a_stage_the_case_does_not_run_fails_its_stage_items(inner, monkeypatch):
    """Another tool's file giving a ratio-128 step an index_scoring payload: verify finds no such stage."""
    inner.without_device(monkeypatch)
    case = ci_cases(R128_ID)[0]
    scores = {"scores": np.zeros(3, np.float32)}
    extra = replace(case, steps=[replace(step, stages={**step.stages, "index_scoring": scores}) for step in case.steps])
    write_goldens(inner.pytester.path / "extra.h5", [extra])
    found = outcomes(inner.run(goldens="extra.h5"))
    for stage in R128_STAGES:
        outcome, text = found[f"extra.h5::{R128_ID}::{stage}[oracle]"]
        assert outcome == "failed"
        assert text.startswith(f"FAIL {R128_ID} step 0 index_scoring/scores: missing in actual — reproduce: ")


@pytest.mark.parametrize(
    ("case_id", "stored_stages", "stop"),
    [
        # no stored stages: the device side's expected payloads come from the oracle, which rejects
        (REJECTED_ID, False, ": "),
        # stored stages: the device runner's own validation rejects the step
        ("errors.arity-r4-missing-index-weight", True, " step 0: the run stopped at validation: "),
    ],
)
def test_a_stored_step_the_oracle_rejects_fails_every_stage_on_both_sides(
    inner, emulation_backend, case_id, stored_stages, stop
):
    """A file that claims outputs for a step the reference rejects (the stored rejection dropped)."""
    case = ci_cases(case_id)[0]
    payload = {"Y": np.zeros(1, np.float32)}
    claimed = replace(case, steps=[
        replace(step, expect_error=None, outputs=payload, stages={"writeback": payload} if stored_stages else {})
        for step in case.steps
    ])
    write_goldens(inner.pytester.path / "claimed.h5", [claimed])
    inner.emulate_device(emulation_backend)
    found = outcomes(inner.run(goldens="claimed.h5"))
    assert set(found) == {
        f"claimed.h5::{case_id}::{stage}[{side}]" for stage in R4_STAGES for side in ("oracle", "device")
    }
    message = case.steps[0].expect_error
    for stage in R4_STAGES:
        oracle = found[f"claimed.h5::{case_id}::{stage}[oracle]"]
        assert oracle == ("failed", f"FAIL {case_id} step 0: oracle rejected the stored step: {message} — "
                                    f"reproduce: csa-conform verify claimed.h5 --case {case_id}")
        device = found[f"claimed.h5::{case_id}::{stage}[device]"]
        assert device == ("failed", f"{case_id}{stop}this oracle rejects a step the golden file accepted: "
                                    f"{message}\n  reproduce: csa-conform diff claimed.h5 --stage all --mode chained "
                                    f"--case {case_id} --build strict")


@pytest.mark.parametrize("dist", ["load", "loadscope"])
def test_xdist_gives_the_same_outcomes(inner, emulation_backend, tmp_path, dist):
    pytest.importorskip("xdist")
    mutant = next(mutant for mutant in MUTANTS if mutant.name == "index_score_without_head_normalization")
    kernels = mutant.apply(KERNELS, tmp_path / "kernels")
    inner.emulate_device(emulation_backend)
    serial = statuses(inner.run(f"--csa-kernels={kernels}"))
    spread = inner.run(f"--csa-kernels={kernels}", "-p", "xdist.plugin", "-n", "2", "--dist", dist)
    assert statuses(spread) == serial
    assert list(serial.values()).count("failed") == 1
    spread.stdout.fnmatch_lines(["csa-conform: 12 device items ran on host emulation (g++)"])


def test_a_file_without_stage_payloads_skips_their_oracle_items_and_still_compares_the_device(
    inner, emulation_backend
):
    case = ci_cases(R4_ID)[0]
    bare = replace(case, steps=[replace(step, stages={}) for step in case.steps])
    write_goldens(inner.pytester.path / "bare.h5", [bare])
    inner.emulate_device(emulation_backend)
    found = outcomes(inner.run(goldens="bare.h5"))
    for stage in R4_STAGES:
        oracle = found[f"bare.h5::{R4_ID}::{stage}[oracle]"]
        if stage == "writeback":
            assert oracle == ("passed", "")
        else:
            assert oracle == ("skipped", f"the golden file holds no {stage} payload for {R4_ID}: nothing to "
                                         "verify (the device item compares with the oracle's)")
        assert found[f"bare.h5::{R4_ID}::{stage}[device]"][0] == "passed"


def test_the_build_reaches_the_runner(inner, emulation_backend, tmp_path):
    """--csa-build production compiles without --fmad=false: with the kernels' products left plain
    (-DCSA_CONTRACTIBLE, from the directory's manifest) the emulation contracts a*b+c into fmas, the
    device items see what that does and their reproduce commands spell the build."""
    kernels = Path(shutil.copytree(KERNELS, tmp_path / "kernels"))
    (kernels / "csa-kernels.toml").write_text('nvrtc-options = ["-DCSA_CONTRACTIBLE"]\n')
    inner.emulate_device(emulation_backend)
    found = outcomes(inner.run("--csa-build", "production", "--csa-case", R4_ID, f"--csa-kernels={kernels}"))
    assert {found[node][0] for node in found if node.endswith("[oracle]")} == {"passed"}
    failed = [text for node, (outcome, text) in found.items() if node.endswith("[device]") and outcome == "failed"]
    assert failed and all("--build production" in text for text in failed)


@pytest.mark.cuda
def test_device_items_run_on_the_cuda_device(inner, cuda_device, tmp_path):
    result = inner.run()
    assert result.ret == pytest.ExitCode.OK
    assert statuses(result) == dict.fromkeys(expected_ids(), "passed")
    result.stdout.fnmatch_lines([f"csa-conform: 12 device items ran on {cuda_device.name}"])
    mutant = next(mutant for mutant in MUTANTS if mutant.name == "index_score_without_head_normalization")
    found = statuses(inner.run(f"--csa-kernels={mutant.apply(KERNELS, tmp_path / 'kernels')}"))
    assert [node for node, outcome in found.items() if outcome != "passed"] == [
        f"goldens.h5::{R4_ID}::index_scoring[device]"
    ]


def test_an_invalid_case_is_one_failing_item_and_the_other_cases_run(inner, monkeypatch):
    """A case that cannot be read (here a string tensor) is collected as one validation item that fails
    with verify's `invalid` line; the file's other cases get their items as usual."""
    inner.without_device(monkeypatch)
    query = f"/cases/{R4_ID}/steps/0000/inputs/query"
    with h5py.File(inner.pytester.path / inner.goldens, "r+") as handle:
        del handle[query]
        handle.create_dataset(query, data="text")
        handle[query].attrs["sha256"] = "0" * 64
    result = inner.run()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    found = outcomes(result)
    r4 = {node: value for node, value in found.items() if f"::{R4_ID}::" in node}
    assert list(r4) == [f"goldens.h5::{R4_ID}::validation[oracle]"]
    outcome, text = r4[f"goldens.h5::{R4_ID}::validation[oracle]"]
    assert outcome == "failed" and text.startswith(f"INVALID {R4_ID}: ") and "golden tensors are numbers" in text
    assert text.endswith(f" — reproduce: csa-conform verify goldens.h5 --case {R4_ID}")
    others = [node for node in ORACLE_IDS if R4_ID not in node]
    assert others and {found[node][0] for node in others} == {"passed"}


def test_a_kernel_that_segfaults_fails_its_launchs_items_as_a_fault_and_the_session_goes_on(
        inner, emulation_backend, tmp_path):
    kernels = tmp_path / "kernels"
    shutil.copytree(KERNELS, kernels)
    module = kernels / "csa_ratio128_attention.cu"
    entry = "    if ((int)blockIdx.x >= batch * sequence * heads) return;\n"
    module.write_text(module.read_text().replace(entry, entry + "    output[1LL << 40] = 1.0f;\n"))
    inner.emulate_device(emulation_backend)
    result = inner.run(f"--csa-kernels={kernels}")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    found = outcomes(result)
    launch = {f"goldens.h5::{R128_ID}::{stage}[device]" for stage in ("candidate_assembly",
                                                                      "sparse_sink_softmax_attention")}
    assert {node for node, (outcome, _) in found.items() if outcome == "failed"} == launch
    assert all(found[node][0] == "passed" for node in ORACLE_IDS)
    text = found[f"goldens.h5::{R128_ID}::candidate_assembly[device]"][1]
    assert "fault: SIGSEGV in csa_ratio128_attention:csa_ratio128_sink_attention" in text
    assert "[csa_ratio128_attention.cu:csa_ratio128_sink_attention]" in text.splitlines()[0]
