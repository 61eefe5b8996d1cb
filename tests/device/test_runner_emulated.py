"""The device runner end to end on the host emulation of the kernels: chained, isolated and
force-host runs must diff clean, launches must follow the seed's shapes (or a module's declared
block) and be recorded,
and chained streams must thread present_* device buffers into the next step."""

from __future__ import annotations

import math

import pytest
from device_fixtures import pick

from csa_conform.check.conformance import check_case, replay
from csa_conform.compare.testing import assert_bits_equal
from csa_conform.device import DeviceRunner, KernelDirectory
from csa_conform.device.host import EmulatedArray
from csa_conform.device.provenance import HOST_PATH, NVRTC_PATH
from csa_conform.errors import DeviceUnavailable
from csa_conform.golden import GoldenFile
from csa_conform.spec import STAGE_NAMES, Mode

pytestmark = pytest.mark.usefixtures("emulated_cuda")


def _reports(path, runner, patterns=None):
    with GoldenFile(path) as golden:
        ids = golden.case_ids()
        if patterns:
            ids = [pick(ids, pattern) for pattern in patterns]
        return [check_case(golden, case, runner, STAGE_NAMES) for case in ids]


def _case(path, pattern: str) -> str:
    with GoldenFile(path) as golden:
        return pick(golden.case_ids(), pattern)


def _assert_clean(reports):
    for report in reports:
        problems = [diff.summary() for verdict in report.diverged() for diff in verdict.diffs]
        assert report.passed, f"{report.case}: {report.failure} {problems}"


@pytest.mark.parametrize("mode", ["chained", "isolated"])
def test_every_case_is_bit_exact(device_goldens, mode):
    reports = _reports(device_goldens, DeviceRunner(mode=mode))
    _assert_clean(reports)
    compared = {report.case: report.compared_steps for report in reports}
    assert all(count == 0 for case, count in compared.items() if case.startswith("errors."))
    assert all(count > 0 for case, count in compared.items() if not case.startswith("errors."))


@pytest.mark.parametrize("stage", STAGE_NAMES)
def test_forcing_one_stage_to_the_host_stays_clean(device_goldens, stage):
    cases = ["boundaries.r4-chunks-*", "boundaries.r128-*"]
    runner = DeviceRunner(mode="chained", force_host={stage})
    _assert_clean(_reports(device_goldens, runner, cases))
    host = [launch for launch in runner.provenance.launches if launch.path == HOST_PATH]
    assert host and {launch.stages for launch in host} == {(stage,)}


def test_all_host_control_needs_no_device(device_goldens, monkeypatch):
    def no_device():
        raise DeviceUnavailable("the all-host control must not touch the device")

    runner = DeviceRunner(force_host=set(STAGE_NAMES), backend_factory=no_device)
    _assert_clean(_reports(device_goldens, runner))
    assert runner.provenance.device is None
    assert {launch.path for launch in runner.provenance.launches} == {HOST_PATH}


def test_chained_streams_thread_device_buffers_and_isolated_do_not(device_goldens, monkeypatch):
    seen = {}
    original = DeviceRunner.run_step

    def spy(self, attrs, inputs, output_names, *, past=None, **kwargs):
        seen.setdefault(self.mode, []).append(dict(past or {}))
        return original(self, attrs, inputs, output_names, past=past, **kwargs)

    monkeypatch.setattr(DeviceRunner, "run_step", spy)
    case = "boundaries.r4-chunks-*"
    _reports(device_goldens, DeviceRunner(mode="chained"), [case])
    _reports(device_goldens, DeviceRunner(mode="isolated"), [case])
    assert len(seen[Mode.CHAINED]) > 1
    chained = seen[Mode.CHAINED]
    assert chained[0] == {}
    for past in chained[1:]:
        assert set(past) == {"past_compressed_kv", "past_compression_carry", "past_index_key", "past_index_carry"}
        assert all(isinstance(value, EmulatedArray) for value in past.values())
    assert all(past == {} for past in seen[Mode.ISOLATED])


def test_launches_follow_the_seed_shapes_and_are_recorded(device_goldens):
    runner = DeviceRunner()
    case = _case(device_goldens, "random.r4-5out*")
    _assert_clean(_reports(device_goldens, runner, [case]))
    kernels = KernelDirectory()
    with GoldenFile(device_goldens) as golden:
        info = golden.case_info(case)
        step = golden.read_step(case, 0)
    batch, sequence, heads, _ = step.inputs["query"].shape
    index_heads = step.inputs["index_query"].shape[2]
    total = int(step.inputs["total_sequence_length"])
    topk = min(int(info.attrs["index_topk"]), total // 4)
    expected = {  # the seed's grids; the built-ins declare wider blocks than its single thread
        "csa_ratio4_main_compression": (batch, 256),
        "csa_ratio4_index_compression": (batch, 256),
        "csa_ratio4_index_select": (batch * sequence, 512),
        "csa_ratio4_index_replicate": (max(1, math.ceil(batch * index_heads * sequence * topk / 256)), 256),
        "csa_ratio4_attention": (batch * sequence * heads, 256),
    }
    launches = [launch for launch in runner.provenance.launches if launch.step == 0]
    assert [launch.module for launch in launches] == list(expected)
    for launch in launches:
        assert launch.path == NVRTC_PATH and launch.case == case
        assert (launch.grid[0], launch.block[0]) == expected[launch.module]
        assert launch.grid[1:] == (1, 1) and launch.block[1:] == (1, 1)
        source = kernels.module(launch.module)
        assert (launch.entry, launch.source_sha256) == (source.entry, source.sha256)
    record = runner.provenance.to_dict()
    assert record["device"]["name"] == "host emulation (g++)"
    assert all("--fmad=false" in module["options"] for module in record["modules"].values())
    assert set(expected) <= set(record["modules"]) and record["kernels"]["build"]["profile"] == "strict"
    declared = {module: record["modules"][module]["declared_block"] for module in expected}
    assert declared == {"csa_ratio4_main_compression": 256, "csa_ratio4_index_compression": 256,
                        "csa_ratio4_index_select": 512, "csa_ratio4_index_replicate": None,
                        "csa_ratio4_attention": None}
    assert record["launches"][0]["scratch"] == {"record_capacity": total // 4}


def test_isolated_mode_requires_the_oracle_payloads(device_goldens):
    with GoldenFile(device_goldens) as golden:
        case = pick(golden.case_ids(), "boundaries.r4-prefill-5")
        info, step = golden.case_info(case), golden.read_step(case, 0)
    with pytest.raises(Exception, match="isolated mode needs"):
        DeviceRunner(mode="isolated").run_step(info.attrs, step.inputs, info.output_names)


def test_device_results_answer_like_the_oracle(device_goldens):
    with GoldenFile(device_goldens) as golden:
        outcome = next(replay(golden, "boundaries.r4-prefill-5", DeviceRunner()))
    result = outcome.actual
    assert list(result.stages) == [stage for stage in STAGE_NAMES if stage in outcome.expected]
    for stage, payload in outcome.expected.items():
        for name, array in payload.items():
            assert result.stages[stage][name].dtype == array.dtype, (stage, name)
            assert result.stages[stage][name].shape == array.shape, (stage, name)
    assert set(result.outputs) == set(outcome.expected["writeback"])
    assert_bits_equal(result.outputs["Y"], outcome.expected["writeback"]["Y"], "writeback/Y")
