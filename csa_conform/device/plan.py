"""Which stage runs where, and what feeds it: the plan a device run follows.

Pure Python so it is tested without a GPU. ``chained`` is production: every
stage reads what the stages before it produced in this run (device buffers,
or host payloads uploaded when a stage is forced to the host) and a stream
threads its present_* into the next step's past_*. ``isolated`` feeds every
stage the oracle's (golden) payloads for anything upstream and the golden
past_* inputs, so a divergence shows at the stage that makes it. Stages named
in force-host run on the host oracle inside the device run, as the seed's
ONNX_GENAI_CSA_FORCE_HOST does for all of them.

Kernels fuse stages (index select = stages 3-5, attention = stages 6-7), so
a device launch runs when any stage it covers is on the device, and inside it
later stages read the kernel's own intermediate values ("fused").
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from csa_conform.errors import UsageError
from csa_conform.spec import BY_NAME, PAST_STATE, STAGE_NAMES, Launch, Mode, launches_for_ratio, resolve_stage
from csa_conform.spec import stages_for_ratio as _registry_stages

FORCE_HOST_ENV = "CSA_CONFORM_FORCE_HOST"
SEED_FORCE_HOST_ENV = "ONNX_GENAI_CSA_FORCE_HOST"

DEVICE = "device"
HOST = "host"


def stages_for_ratio(ratio: int) -> tuple[str, ...]:
    if ratio not in (4, 128):
        raise UsageError(f"compression_ratio must be 4 or 128, got {ratio}")
    return tuple(stage.name for stage in _registry_stages(ratio))


def parse_force_host(spec: str | None) -> frozenset[str]:
    """'stage,stage' (any spelling the registry knows: name, short name, number) or 'all'."""
    if spec is None or not spec.strip():
        return frozenset()
    names = [name.strip() for name in spec.split(",") if name.strip()]
    if "all" in names:
        return frozenset(STAGE_NAMES)
    unknown = [name for name in names if resolve_stage(name) is None]
    if unknown:
        raise UsageError(
            f"unknown stage(s) {', '.join(unknown)} in force-host list; stages are all, {', '.join(STAGE_NAMES)}"
        )
    return frozenset(resolve_stage(name).name for name in names)


def force_host_from_environment(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """CSA_CONFORM_FORCE_HOST=stage,...|all, and the seed's switch: set and not "0"/empty means all."""
    environ = os.environ if environ is None else environ
    seed = environ.get(SEED_FORCE_HOST_ENV)
    if seed is not None and seed not in ("", "0"):
        return frozenset(STAGE_NAMES)
    return parse_force_host(environ.get(FORCE_HOST_ENV))


@dataclass(frozen=True)
class StagePlan:
    stage: str
    placement: str
    feeds: tuple[tuple[str, str], ...]

    @property
    def on_device(self) -> bool:
        return self.placement == DEVICE


@dataclass(frozen=True)
class StepPlan:
    ratio: int
    mode: Mode
    stages: tuple[StagePlan, ...]
    launches: tuple[Launch, ...]

    def stage(self, name: str) -> StagePlan:
        for plan in self.stages:
            if plan.stage == name:
                return plan
        raise KeyError(name)

    def placement(self, name: str) -> str:
        return self.stage(name).placement

    @property
    def uses_device(self) -> bool:
        return bool(self.launches)

    def describe(self) -> list[dict]:
        return [
            {"stage": plan.stage, "placement": plan.placement, "feeds": dict(plan.feeds)}
            for plan in self.stages
        ]


def _launch_of(calls: tuple[Launch, ...], stage: str) -> Launch | None:
    """The launch that computes a stage with what feeds it (the first, fused one, not a fan-out)."""
    return next((launch for launch in calls if stage in launch.stages), None)


def _source(mode: Mode, calls: tuple[Launch, ...], stage: str, upstream: str, placement: Mapping[str, str]) -> str:
    if upstream == PAST_STATE:
        return "golden past_* inputs" if mode is Mode.ISOLATED else "previous step's present_* (this run)"
    if mode is Mode.ISOLATED:
        return f"oracle {upstream}"
    own = _launch_of(calls, stage)
    if placement[stage] == DEVICE and own is not None and upstream in own.stages:
        return f"fused {upstream} ({own.module})"
    return f"{placement[upstream]} {upstream}"


def plan_step(ratio: int, mode: Mode | str, force_host: frozenset[str] | set[str] = frozenset(),
              calls: tuple | None = None) -> StepPlan:
    """``calls`` are what computes the device stages (anything with ``module`` and ``stages``): the
    built-in launches of the ratio unless a Python provider's calls are given (csa_conform.device.provider)."""
    mode = Mode(mode)
    calls = launches_for_ratio(ratio) if calls is None else calls
    stages = stages_for_ratio(ratio)
    placement = {stage: HOST if stage in force_host else DEVICE for stage in stages}
    plans = []
    for stage in stages:
        feeds = tuple(
            (upstream, _source(mode, calls, stage, upstream, placement))
            for upstream in BY_NAME[stage].reads
            if upstream == PAST_STATE or upstream in placement
        )
        plans.append(StagePlan(stage, placement[stage], feeds))
    launches = tuple(launch for launch in calls if any(placement[stage] == DEVICE for stage in launch.stages))
    return StepPlan(ratio, mode, tuple(plans), launches)
