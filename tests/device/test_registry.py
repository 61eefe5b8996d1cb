"""The pipeline spec is the one description the oracle, the device plan and the CLI derive from."""

from __future__ import annotations

import pytest

from csa_conform.device.kernels import MODULES
from csa_conform.device.plan import DEVICE, plan_step
from csa_conform.spec import LAUNCHES, PIPELINE, STATE_THREADING, WRITEBACK_SOURCES, Mode, resolve_stage


def test_every_launch_names_a_read_back_and_registered_stages():
    from csa_conform.device import launches

    names = {stage.name for stage in PIPELINE}
    for launch in LAUNCHES:
        assert callable(launches.READ_BACKS[launch.read_back]), launch.module
        assert set(launch.stages) <= names
        assert all(launch.ratio in next(s for s in PIPELINE if s.name == name).ratios for name in launch.stages)
    assert MODULES == {
        "csa_ratio128_compression": "csa_ratio128_compress",
        "csa_ratio4_main_compression": "csa_ratio4_main_compress",
        "csa_ratio4_index_compression": "csa_ratio4_index_compress",
        "csa_ratio4_index_select": "csa_ratio4_index_select",
        "csa_ratio4_index_replicate": "csa_ratio4_index_replicate",
        "csa_ratio128_attention": "csa_ratio128_sink_attention",
        "csa_ratio4_attention": "csa_ratio4_sink_attention",
    }


def test_stream_state_and_writeback_come_from_the_stages_that_write_them():
    assert STATE_THREADING == {
        "present_compressed_kv": "past_compressed_kv",
        "present_compression_carry": "past_compression_carry",
        "present_index_key": "past_index_key",
        "present_index_carry": "past_index_carry",
    }
    assert WRITEBACK_SOURCES == {
        "present_compressed_kv": ("compression_update", "present_compressed_kv"),
        "present_compression_carry": ("compression_update", "present_compression_carry"),
        "present_index_key": ("index_key_update", "present_index_key"),
        "present_index_carry": ("index_key_update", "present_index_carry"),
        "selected_indices": ("selection", "selected_indices"),
        "Y": ("sparse_sink_softmax_attention", "Y"),
    }


@pytest.mark.parametrize("spelling", ["selection", "select", "5", "5:select", " 5:select "])
def test_a_stage_has_four_spellings(spelling):
    assert resolve_stage(spelling).name == "selection"


def test_unknown_stage_spelling_resolves_to_nothing():
    assert resolve_stage("9") is None and resolve_stage("selected") is None


@pytest.mark.parametrize("ratio", [4, 128])
def test_every_stage_a_plan_keeps_on_the_device_is_computed_by_a_launch_or_is_writeback(ratio):
    plan = plan_step(ratio, Mode.CHAINED)
    covered = {stage for launch in plan.launches for stage in launch.stages}
    assert {stage.stage for stage in plan.stages if stage.placement == DEVICE} - covered == {"writeback"}
