"""Mode planning and force-host parsing: which stage runs where, and what feeds it (no GPU)."""

from __future__ import annotations

import pytest

from csa_conform.device.plan import (
    DEVICE,
    FORCE_HOST_ENV,
    HOST,
    SEED_FORCE_HOST_ENV,
    force_host_from_environment,
    parse_force_host,
    plan_step,
    reads_own,
    stages_for_ratio,
)
from csa_conform.errors import UsageError
from csa_conform.spec import STAGE_NAMES, Mode


def test_ratio128_has_no_index_stages():
    assert stages_for_ratio(128) == (
        "compression_update", "candidate_assembly", "sparse_sink_softmax_attention", "writeback"
    )
    assert stages_for_ratio(4) == STAGE_NAMES
    with pytest.raises(UsageError):
        stages_for_ratio(8)


@pytest.mark.parametrize("ratio", [4, 128])
def test_default_plan_runs_every_stage_on_device_with_the_seed_launches(ratio):
    plan = plan_step(ratio, Mode.CHAINED)
    assert all(stage.placement == DEVICE for stage in plan.stages)
    expected = {
        128: ["csa_ratio128_compression", "csa_ratio128_attention"],
        4: [
            "csa_ratio4_main_compression",
            "csa_ratio4_index_compression",
            "csa_ratio4_index_select",
            "csa_ratio4_index_replicate",
            "csa_ratio4_attention",
        ],
    }[ratio]
    assert [launch.module for launch in plan.launches] == expected


def test_all_host_plan_launches_nothing():
    plan = plan_step(4, Mode.CHAINED, parse_force_host("all"))
    assert plan.launches == ()
    assert not plan.uses_device
    assert {stage.placement for stage in plan.stages} == {HOST}


def test_fused_launch_runs_while_any_of_its_stages_is_on_device():
    plan = plan_step(4, Mode.CHAINED, {"index_query_finalize", "index_scoring"})
    modules = [launch.module for launch in plan.launches]
    assert "csa_ratio4_index_select" in modules
    assert "csa_ratio4_index_replicate" in modules
    selection_forced = plan_step(4, Mode.CHAINED, {"selection"})
    modules = [launch.module for launch in selection_forced.launches]
    assert "csa_ratio4_index_select" in modules
    assert "csa_ratio4_index_replicate" not in modules
    attention_forced = plan_step(4, Mode.CHAINED, {"candidate_assembly", "sparse_sink_softmax_attention"})
    assert "csa_ratio4_attention" not in [launch.module for launch in attention_forced.launches]


def test_chained_feeds_follow_placement_and_fusion():
    plan = plan_step(4, Mode.CHAINED, {"index_query_finalize"})
    feeds = dict(plan.stage("index_scoring").feeds)
    assert feeds["index_query_finalize"] == "fused index_query_finalize (csa_ratio4_index_select)"
    assert feeds["index_key_update"] == "device index_key_update"
    host_scoring = plan_step(4, Mode.CHAINED, {"index_scoring"})
    assert dict(host_scoring.stage("index_scoring").feeds)["index_query_finalize"] == "device index_query_finalize"
    assert dict(plan.stage("compression_update").feeds)["past_state"].startswith("previous step")


def test_isolated_feeds_every_launch_from_the_oracle_and_its_stages_from_itself():
    plan = plan_step(4, Mode.ISOLATED)
    fused = {("index_scoring", "index_query_finalize"): "csa_ratio4_index_select",
             ("selection", "index_scoring"): "csa_ratio4_index_select",
             ("sparse_sink_softmax_attention", "candidate_assembly"): "csa_ratio4_attention"}
    for stage in plan.stages:
        for upstream, source in stage.feeds:
            if upstream == "past_state":
                assert source == "golden past_* inputs"
            elif (stage.stage, upstream) in fused:
                assert source == f"fused {upstream} ({fused[stage.stage, upstream]})"
            else:
                assert source == f"oracle {upstream}", (stage.stage, upstream)


def test_isolated_host_stages_read_the_host_values_of_their_own_launch():
    """A host stage stands in for its launch: its launch's earlier stages from the host when they ran there,
    from the oracle when the device did, and every other launch's from the oracle."""
    all_host = plan_step(4, Mode.ISOLATED, set(STAGE_NAMES))
    feeds = dict(all_host.stage("selection").feeds)
    assert feeds["index_scoring"] == "host index_scoring"
    assert dict(all_host.stage("index_scoring").feeds)["index_key_update"] == "oracle index_key_update"
    assert dict(all_host.stage("candidate_assembly").feeds)["selection"] == "oracle selection"
    selection_only = plan_step(4, Mode.ISOLATED, {"selection"})
    assert dict(selection_only.stage("selection").feeds)["index_scoring"] == "oracle index_scoring"
    assert reads_own(all_host, "selection", "index_scoring")
    assert not reads_own(selection_only, "selection", "index_scoring")
    assert not reads_own(all_host, "candidate_assembly", "selection")


def test_describe_is_serialisable():
    description = plan_step(128, "isolated").describe()
    assert [entry["stage"] for entry in description] == list(stages_for_ratio(128))
    assert all(entry["placement"] == DEVICE for entry in description)


@pytest.mark.parametrize(
    "spec, expected",
    [
        (None, set()),
        ("", set()),
        ("selection", {"selection"}),
        (" selection , index_scoring ", {"selection", "index_scoring"}),
        ("all", set(STAGE_NAMES)),
        ("selection,all", set(STAGE_NAMES)),
    ],
)
def test_parse_force_host(spec, expected):
    assert parse_force_host(spec) == frozenset(expected)


def test_parse_force_host_rejects_unknown_stages():
    with pytest.raises(UsageError, match="unknown stage"):
        parse_force_host("selection,attn")


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({}, set()),
        ({FORCE_HOST_ENV: "writeback"}, {"writeback"}),
        ({FORCE_HOST_ENV: "all"}, set(STAGE_NAMES)),
        ({SEED_FORCE_HOST_ENV: "1"}, set(STAGE_NAMES)),
        ({SEED_FORCE_HOST_ENV: "yes", FORCE_HOST_ENV: "selection"}, set(STAGE_NAMES)),
        ({SEED_FORCE_HOST_ENV: "0"}, set()),
        ({SEED_FORCE_HOST_ENV: ""}, set()),
        ({SEED_FORCE_HOST_ENV: "0", FORCE_HOST_ENV: "selection"}, {"selection"}),
    ],
)
def test_force_host_environment_follows_the_seed(environ, expected):
    assert force_host_from_environment(environ) == frozenset(expected)
