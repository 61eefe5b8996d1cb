"""Scale-out: `diff --shard K/N` over CI machines merged back by `report`, and `diff --devices`
over the GPUs of one host (forked workers on the host emulation, each a fake device). Either
way the results document must be the unsharded, single-device one, timings aside."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

import csa_conform.device.cuda as cuda
import csa_conform.device.devices as devices
from csa_conform._base.shards import Shard, interleave, parse_shard, shard_from_environment, without_shard
from csa_conform.check.results import schema
from csa_conform.cli.diff import diff
from csa_conform.cli.report import report_command
from csa_conform.errors import UsageError
from csa_conform.exitcodes import ExitCode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels_mutants"))
from mutants import MUTANTS  # noqa: E402

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
SINK = next(mutant for mutant in MUTANTS if mutant.name == "missing_sink")


@pytest.mark.parametrize("count", range(0, 12))
@pytest.mark.parametrize("total", [1, 2, 3, 5])
def test_shards_partition_the_cases_and_interleave_restores_their_order(count, total):
    cases = [f"case-{index:02d}" for index in range(count)]
    parts = [Shard(index, total).select(cases) for index in range(1, total + 1)]
    assert sorted(case for part in parts for case in part) == cases
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    assert interleave(parts) == cases


def test_shard_spellings():
    assert parse_shard("2/3") == Shard(2, 3) and str(Shard(2, 3)) == "2/3"
    for bad in ("0/3", "4/3", "3", "a/b", "1/0", "-1/2", ""):
        with pytest.raises(UsageError, match="is not a shard K/N"):
            parse_shard(bad)


def test_shard_from_the_ci_environment():
    assert shard_from_environment({}) is None
    assert shard_from_environment({"CI_NODE_INDEX": "2", "CI_NODE_TOTAL": "4"}) == Shard(2, 4)
    assert shard_from_environment({"CSA_CONFORM_SHARD": "1/2", "CI_NODE_INDEX": "2", "CI_NODE_TOTAL": "4"}) \
        == Shard(1, 2)
    assert shard_from_environment({"CI_NODE_INDEX": "2"}) is None
    with pytest.raises(UsageError, match="CI_NODE_INDEX/CI_NODE_TOTAL: '5/4'"):
        shard_from_environment({"CI_NODE_INDEX": "5", "CI_NODE_TOTAL": "4"})


def test_without_shard_removes_both_spellings():
    assert without_shard(["csa-conform", "diff", "--shard", "1/2", "--json", "--shard=2/2", "-q"]) == \
        ["csa-conform", "diff", "--json", "-q"]


def _untimed(document: dict) -> dict:
    """A results document without its wall-clock times."""
    document = json.loads(json.dumps(document))
    document["summary"].pop("time_s")
    for case in document["cases"]:
        case.pop("time_s")
    return document


def _untimed_junit(text: str) -> str:
    return re.sub(r' time="[0-9.]+"', "", text)


def _run(*args, env=None) -> tuple[int, dict]:
    result = CliRunner().invoke(diff, [str(arg) for arg in args] + ["--json"], env=env or {})
    assert result.exit_code in (ExitCode.OK, ExitCode.DIVERGED), result.output[-3000:]
    document = json.loads(result.stdout)
    jsonschema.validate(document, schema())
    return result.exit_code, document


@pytest.fixture
def sink_kernels(tmp_path):
    """Kernels that diverge on the ratio-128 cases only, so a merge has failures to place."""
    return SINK.apply(KERNELS, tmp_path / "kernels")


@pytest.mark.usefixtures("emulated_cuda")
@pytest.mark.parametrize("mode", [[], ["--replay", "graph"]], ids=["eager", "replay"])
def test_merged_shards_are_the_unsharded_run(device_goldens, sink_kernels, tmp_path, mode):
    code, whole = _run(device_goldens, "--kernels", sink_kernels, *mode)
    assert code == ExitCode.DIVERGED and 0 < whole["summary"]["failed"] < whole["summary"]["cases"]
    paths = []
    for index in (1, 2, 3):
        _, shard = _run(device_goldens, "--kernels", sink_kernels, "--shard", f"{index}/3", *mode)
        assert shard["options"]["shard"] == f"{index}/3"
        assert [case["case"] for case in shard["cases"]] == [case["case"] for case in whole["cases"]][index - 1::3]
        paths.append(tmp_path / f"shard-{index}.json")
        paths[-1].write_text(json.dumps(shard))
    (tmp_path / "whole.json").write_text(json.dumps(whole))
    merged, junit, whole_junit = tmp_path / "merged.json", tmp_path / "junit.xml", tmp_path / "whole.xml"
    result = CliRunner().invoke(report_command, [str(path) for path in reversed(paths)]
                                + ["--merged", str(merged), "--junit", str(junit)])
    assert result.exit_code == ExitCode.OK, result.output
    assert "report: 1 runs," in result.output
    CliRunner().invoke(report_command, [str(tmp_path / "whole.json"), "--junit", str(whole_junit)])
    jsonschema.validate(json.loads(merged.read_text()), schema())
    assert _untimed(json.loads(merged.read_text())) == _untimed(whole)
    assert _untimed_junit(junit.read_text()) == _untimed_junit(whole_junit.read_text())


@pytest.mark.usefixtures("emulated_cuda")
def test_report_refuses_shards_that_do_not_make_one_run(device_goldens, tmp_path):
    for index in (1, 3):
        _, shard = _run(device_goldens, "--force-host", "all", "--shard", f"{index}/3", "--case", "boundaries.*")
        (tmp_path / f"shard-{index}.json").write_text(json.dumps(shard))
    result = CliRunner().invoke(report_command, [str(tmp_path / "shard-1.json"), str(tmp_path / "shard-3.json"),
                                                 "--junit", str(tmp_path / "junit.xml")])
    assert result.exit_code == ExitCode.USAGE
    assert "do not add up to one run: missing 2/3" in result.output
    assert not (tmp_path / "junit.xml").exists()
    result = CliRunner().invoke(report_command, [str(tmp_path / "shard-1.json"), str(tmp_path / "shard-1.json"),
                                                 str(tmp_path / "shard-3.json"), "--junit", str(tmp_path / "j.xml")])
    assert "given twice 1/3" in result.output


@pytest.mark.usefixtures("emulated_cuda")
def test_ci_variables_pick_the_shard_and_one_of_one_is_everything(device_goldens):
    result = CliRunner().invoke(diff, [str(device_goldens), "--force-host", "all", "-q"],
                                env={"CI_NODE_INDEX": "2", "CI_NODE_TOTAL": "3"})
    assert "running shard 2/3 of the cases (CI_NODE_INDEX/CI_NODE_TOTAL; --shard 1/1 runs all)" in result.stderr
    _, gitlab = _run(device_goldens, "--force-host", "all", env={"CI_NODE_INDEX": "2", "CI_NODE_TOTAL": "3"})
    _, option = _run(device_goldens, "--force-host", "all", "--shard", "2/3")
    assert _untimed(gitlab) == _untimed(option) and gitlab["options"]["shard"] == "2/3"
    _, everything = _run(device_goldens, "--force-host", "all", "--shard", "1/1",
                         env={"CSA_CONFORM_SHARD": "1/2"})
    assert "shard" not in everything["options"] and everything["summary"]["cases"] > gitlab["summary"]["cases"]
    result = CliRunner().invoke(diff, [str(device_goldens), "--shard", "3/2"])
    assert result.exit_code == ExitCode.USAGE and "'3/2' is not a shard K/N" in result.output


@pytest.fixture
def fake_devices(monkeypatch, emulation_backend, tmp_path):
    """Every CUDA backend is the host emulation; each creation logs its process and visible device."""
    log = tmp_path / "backends"
    log.mkdir()

    def backend():
        (log / str(os.getpid())).write_text(os.environ.get(devices.VISIBLE_ENV, ""))
        return emulation_backend

    monkeypatch.setattr(cuda, "CudaBackend", backend)
    monkeypatch.setattr(cuda, "initialised", False)  # as in a fresh process (other tests build backends)
    monkeypatch.delenv(devices.VISIBLE_ENV, raising=False)
    return log


@pytest.mark.parametrize("spec, mode", [("0,1", []), ("all", []), ("0,1", ["--replay", "graph"])],
                         ids=["0,1", "all", "0,1-replay"])
def test_devices_spread_cases_over_worker_processes_and_merge_to_one_devices_result(
        device_goldens, sink_kernels, fake_devices, monkeypatch, spec, mode):
    monkeypatch.setattr(devices, "device_count", lambda: 2)
    _, single = _run(device_goldens, "--kernels", sink_kernels, *mode)
    made = list(fake_devices.iterdir())  # in the run's one worker process, never in this one
    assert len(made) == 1 and made[0].name != str(os.getpid())
    made[0].unlink()
    _, spread = _run(device_goldens, "--kernels", sink_kernels, "--devices", spec, *mode)
    workers = {path.name: path.read_text() for path in fake_devices.iterdir()}
    assert len(workers) == 2 and str(os.getpid()) not in workers
    assert sorted(workers.values()) == ["0", "1"]
    assert _untimed(spread) == _untimed(single)


def test_devices_are_counted_within_the_visible_ones(monkeypatch):
    monkeypatch.setenv(devices.VISIBLE_ENV, "3,5")
    assert [devices.visible_device(ordinal) for ordinal in (0, 1)] == ["3", "5"]
    with pytest.raises(UsageError, match="device 2 is not among CUDA_VISIBLE_DEVICES=3,5"):
        devices.visible_device(2)


@pytest.mark.parametrize("spec", ["0,0", "x", "1,", ""])
def test_bad_device_lists_are_usage_errors(device_goldens, spec):
    result = CliRunner().invoke(diff, [str(device_goldens), "--devices", spec])
    assert result.exit_code == ExitCode.USAGE and "is not 'all' or distinct device ordinals" in result.output


def test_a_process_with_a_cuda_context_spawns_its_workers(device_goldens, monkeypatch):
    """A fork cannot use its parent's CUDA context, so after the device was used workers are spawned
    (and get the work by pickling; an all-host run needs no device to show it)."""
    monkeypatch.setattr(cuda, "initialised", True)
    _, single = _run(device_goldens, "--force-host", "all")
    _, spawned = _run(device_goldens, "--force-host", "all", "--devices", "0,1")
    assert _untimed(spawned) == _untimed(single)
