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
later stages read the kernel's own intermediate values ("fused"), in either
mode: isolated isolates launches, not stages. Host stages forced in for a
launch mirror it: isolated, a host stage reads what the host computed of its
own launch's stages (a control run --force-host all judges what the kernels
can be judged on) and the oracle's payloads of everything else.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from csa_conform.errors import UsageError
from csa_conform.spec import (
    BY_NAME,
    PAST_STATE,
    STAGE_NAMES,
    Launch,
    Mode,
    launches_for_ratio,
    resolve_stage,
)
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
    calls: tuple[Launch, ...] = ()  # every call of the ratio, the unit of fusion

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
    """The call that computes a stage with what feeds it (the first, fused one, not a fan-out)."""
    return next((launch for launch in calls if stage in launch.stages), None)


def _fused(calls: tuple[Launch, ...], stage: str, upstream: str) -> bool:
    """Whether the call that computes ``stage`` computes ``upstream`` too (csa_conform.spec.fused, for the
    calls a run makes: the built-in launches or a Python provider's)."""
    own = _launch_of(calls, stage)
    return own is not None and upstream != stage and upstream in own.stages


def _source(mode: Mode, calls: tuple[Launch, ...], stage: str, upstream: str, placement: Mapping[str, str]) -> str:
    if upstream == PAST_STATE:
        return "golden past_* inputs" if mode is Mode.ISOLATED else "previous step's present_* (this run)"
    own = _launch_of(calls, stage)
    if own is not None and _fused(calls, stage, upstream) and placement[stage] == DEVICE:
        return f"fused {upstream} ({own.module})"
    if mode is Mode.ISOLATED and not (_fused(calls, stage, upstream) and placement[upstream] == placement[stage]):
        return f"oracle {upstream}"
    return f"{placement[upstream]} {upstream}"


def reads_own(plan: StepPlan, stage: str, upstream: str) -> bool:
    """Whether a host stage reads this run's payload of ``upstream`` (chained, or isolated inside its call
    where the host computed that stage too) rather than the oracle's."""
    return plan.mode is Mode.CHAINED or (_fused(plan.calls, stage, upstream)
                                         and plan.placement(upstream) == plan.placement(stage))


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
    return StepPlan(ratio, mode, tuple(plans), launches, tuple(calls))
