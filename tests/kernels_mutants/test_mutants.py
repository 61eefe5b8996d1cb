"""Planted bugs must be caught by `diff`, first at their own stage, and in isolated mode only
where the mutated launch computes; a bug meant for one mode of `diff` (--repeat, ...) only by
that mode. Emulated on the host here; on a GPU with -m cuda."""

from __future__ import annotations

import fnmatch
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from mutants import DIFF_MUTANTS, HOST_PATCHES, MUTANTS

from csa_conform.check.conformance import check_case
from csa_conform.cli.diff import diff
from csa_conform.device import DeviceRunner, KernelDirectory
from csa_conform.device.kernels import MODULES, PRELUDE
from csa_conform.exitcodes import ExitCode
from csa_conform.golden import GoldenFile
from csa_conform.spec import STAGE_NAMES

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
CI_GOLDENS = Path(__file__).resolve().parents[2] / "goldens" / "ci.h5"


def test_mutant_names_are_unique_and_stages_known():
    assert len({mutant.name for mutant in MUTANTS}) == len(MUTANTS)
    for mutant in MUTANTS:
        assert mutant.stage in STAGE_NAMES and mutant.stage in mutant.isolated
        assert mutant.isolated <= set(STAGE_NAMES)


def test_every_kernel_file_has_a_planted_bug():
    assert {mutant.file for mutant in MUTANTS} == {PRELUDE} | {stem + ".cu" for stem in MODULES}


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda mutant: mutant.name)
def test_patch_applies_exactly_once(mutant, tmp_path):
    text = (KERNELS / mutant.file).read_text()
    assert text.count(mutant.old) == 1, f"{mutant.name}: old text found {text.count(mutant.old)} times"
    patched = mutant.apply(KERNELS, tmp_path / "kernels")
    assert (patched / mutant.file).read_text() == text.replace(mutant.old, mutant.new)
    assert (patched / mutant.file).read_text() != text


def _flagged(path: Path, kernels: Path, mode: str, pattern: str, status: str = "diverged",
             **depth) -> list[list[str]]:
    """Per case, the stages whose verdict is ``status`` (``depth``: DeviceRunner's mode options)."""
    runner = DeviceRunner(KernelDirectory(kernels, build="strict"), mode=mode, **depth)
    with GoldenFile(path) as golden:
        cases = [case for case in golden.case_ids() if fnmatch.fnmatchcase(case, pattern)]
        assert cases, f"no golden case matches {pattern}"
        reports = [check_case(golden, case, runner, STAGE_NAMES) for case in cases]
    return [[stage for stage in STAGE_NAMES if report.stages[stage].status == status] for report in reports]


def _divergences(path: Path, kernels: Path, mode: str, pattern: str) -> list[list[str]]:
    return _flagged(path, kernels, mode, pattern)


@pytest.mark.usefixtures("emulated_cuda")
@pytest.mark.parametrize("mutant", DIFF_MUTANTS, ids=lambda mutant: mutant.name)
def test_mutant_is_caught_at_its_stage_on_the_host_emulation(mutant, device_goldens, tmp_path):
    kernels = mutant.apply(KERNELS, tmp_path / "kernels")
    chained = [stages for stages in _divergences(device_goldens, kernels, "chained", mutant.cases) if stages]
    assert chained, f"{mutant.name} was not caught"
    assert {stages[0] for stages in chained} == {mutant.stage}
    isolated = _divergences(device_goldens, kernels, "isolated", mutant.cases)
    assert set().union(*map(set, isolated)) == mutant.isolated


# How each mode of diff is asked for, and the verdict it gives (csa_conform.check.conformance); the guard
# bands are every run's (csa_conform.device.guards).
MODES = {"repeat": ({"repeat": 3}, "non-deterministic"), "replay": ({"replay": "graph"}, "replay-mismatch"),
         "guard": ({}, "out-of-bounds")}
MODE_MUTANTS = tuple(mutant for mutant in MUTANTS if mutant.caught_by != "diff")


def test_every_mode_has_a_mutant_only_it_catches():
    """compute-sanitizer needs a GPU: its tools' mutants are asserted on the device only."""
    assert {mutant.caught_by for mutant in MODE_MUTANTS} == set(MODES)
    assert {mutant.sanitizer for mutant in MUTANTS} >= {"memcheck", "initcheck"}
    assert all(mutant.host in HOST_PATCHES for mutant in MUTANTS if mutant.host)


@pytest.mark.usefixtures("emulated_cuda")
@pytest.mark.parametrize("mutant", MODE_MUTANTS, ids=lambda mutant: mutant.name)
def test_mode_mutant_is_caught_by_its_mode_only_on_the_host_emulation(mutant, device_goldens, tmp_path, monkeypatch):
    kernels = mutant.apply(KERNELS, tmp_path / "kernels")
    if mutant.host:
        HOST_PATCHES[mutant.host](monkeypatch)
    for mode in ("chained", "isolated"):
        assert not any(_divergences(device_goldens, kernels, mode, mutant.cases)), f"plain {mode} diff caught it"
    for name, (depth, status) in MODES.items():
        flagged = [stages for stages in _flagged(device_goldens, kernels, "chained", mutant.cases, status, **depth)
                   if stages]
        if name != mutant.caught_by:
            assert not flagged, f"{mutant.name} was caught by {name}, not only by {mutant.caught_by}"
            continue
        assert flagged, f"{mutant.name} was not caught by {mutant.caught_by}"
        assert {stages[0] for stages in flagged} == {mutant.stage}
        assert set().union(*map(set, flagged)) == mutant.isolated


@pytest.mark.usefixtures("emulated_cuda")
@pytest.mark.parametrize("mode", sorted(MODES))
def test_the_builtin_kernels_pass_every_mode_on_the_host_emulation(mode, device_goldens):
    depth, status = MODES[mode]
    assert not any(_flagged(device_goldens, KERNELS, "chained", "*", status, **depth))
    assert not any(_divergences(device_goldens, KERNELS, "chained", "*"))


@pytest.mark.cuda
@pytest.mark.parametrize("mutant", DIFF_MUTANTS, ids=lambda mutant: mutant.name)
def test_mutant_is_caught_at_its_stage_on_the_device(mutant, device_goldens, tmp_path, cuda_device):
    """The cases the host emulation judges: a fused launch's later stage (index scoring's selection) diverges
    isolated where the kernel's own scores change the top k, which another case of the pattern may show."""
    kernels = mutant.apply(KERNELS, tmp_path / "kernels")
    verdicts = {}
    for mode in ("chained", "isolated"):
        result = CliRunner().invoke(
            diff, [str(device_goldens), "--kernels", str(kernels), "--mode", mode, "--case", mutant.cases, "--json"]
        )
        assert result.exit_code == ExitCode.DIVERGED, result.output[-2000:]
        cases = json.loads(result.stdout)["cases"]
        verdicts[mode] = [[s for s in STAGE_NAMES if case["verdicts"][s] == "diverged"] for case in cases]
    assert {stages[0] for stages in verdicts["chained"] if stages} == {mutant.stage}
    assert set().union(*map(set, verdicts["isolated"])) == mutant.isolated
    shutil.rmtree(kernels)


def _sanitizer_or_skip() -> None:
    from csa_conform.device.sanitizer import find_sanitizer
    from csa_conform.errors import DeviceUnavailable

    try:
        find_sanitizer()
    except DeviceUnavailable as error:
        pytest.skip(str(error))


@pytest.mark.cuda
@pytest.mark.parametrize("mutant", MODE_MUTANTS, ids=lambda mutant: mutant.name)
def test_mode_mutant_is_caught_by_its_mode_only_on_the_device(mutant, tmp_path, cuda_device, monkeypatch):
    if not CI_GOLDENS.exists():
        pytest.fail(f"{CI_GOLDENS} is missing (csa-conform generate --suite ci -o goldens/ci.h5)")
    kernels = mutant.apply(KERNELS, tmp_path / "kernels")
    if mutant.host:
        HOST_PATCHES[mutant.host](monkeypatch)
    base = [str(CI_GOLDENS), "--kernels", str(kernels), "--case", mutant.cases, "--json"]

    def run(*flags):
        result = CliRunner().invoke(diff, base + list(flags))
        assert result.exit_code in (ExitCode.OK, ExitCode.DIVERGED), result.output[-2000:]
        return result.exit_code, json.loads(result.stdout)

    def flagged(document, status):
        return set().union(*({s for s in STAGE_NAMES if case["verdicts"][s] == status} for case in document["cases"]))

    guarded = mutant.caught_by == "guard"  # every run's guard bands catch it, whatever the mode
    plain = ExitCode.DIVERGED if guarded else ExitCode.OK
    for mode in ("chained", "isolated"):
        code, document = run("--mode", mode)
        assert code == plain and not flagged(document, "diverged"), f"plain {mode} diff of {mutant.name}: {code}"
        if guarded:
            assert flagged(document, MODES["guard"][1]) == mutant.isolated
    for name, flags in (("repeat", ["--repeat", "5"]), ("replay", ["--replay", "graph"])):
        code, document = run(*flags)
        if name != mutant.caught_by:
            assert code == plain and not flagged(document, MODES[name][1]), f"{mutant.name} was caught by {name}"
            continue
        assert code == ExitCode.DIVERGED and flagged(document, MODES[name][1]) == mutant.isolated
    if mutant.host:
        return  # the sanitizer's child process runs the kernel directory as it is, without the host half
    _sanitizer_or_skip()
    for tool in ("memcheck", "initcheck"):
        if guarded and tool != mutant.sanitizer:
            continue  # the child run keeps its bands (initcheck) or has none (memcheck): not this mutant's tool
        code, document = run("--sanitize", tool)
        findings = document["sanitizer"]["findings"]
        assert (code == ExitCode.DIVERGED) == (tool == mutant.sanitizer), (tool, findings[:3])
        if tool == mutant.sanitizer:
            assert findings, f"{tool} reported nothing for {mutant.name}"
    shutil.rmtree(kernels)
