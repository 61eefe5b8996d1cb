"""One step's stages in pipeline order, each on the device or on the host oracle.

A stage the plan keeps on the device is computed by its kernel launch
(csa_conform.device.launches, by the read-back its spec entry names); a stage
forced to the host runs the oracle's stage function on what this run produced
upstream (chained) or on the oracle's own payloads (isolated; but what the host
computed of its own launch's stages, as the launch would read it). Either way
its payload lands in the same place, so the result answers in the oracle's shape.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from functools import cache
from typing import Callable, Mapping

import numpy as np

from csa_conform.contract import StepGeometry, attention_bias
from csa_conform.device import launches
from csa_conform.device.determinism import repeat_launch
from csa_conform.device.schedule import turn
from csa_conform.device.guards import GuardedWrites
from csa_conform.device.kernels import KernelDirectory, ModuleSource
from csa_conform.device.plan import DEVICE, StepPlan, reads_own
from csa_conform.device.probes import ProbeLog, ProbeRecorder
from csa_conform.device.provenance import HOST_PATH, NVRTC_PATH, LaunchRecord, RunProvenance
from csa_conform.device.provider import ProbeCalls, ProvidedProbes, Provider
from csa_conform.device.tensors import StepTensors
from csa_conform.errors import ContractError, HostStageRejected, KernelFault
from csa_conform.oracle import StepResult
from csa_conform.oracle.engine import Engine, resolve_engine
from csa_conform.oracle.rows import RowFailure
from csa_conform.oracle.stage_functions import STAGE_FUNCTIONS
from csa_conform.spec import STAGE_NAMES, STATE_THREADING, WRITEBACK, Launch, Mode, Role, Stage, stages_for_ratio


@cache
def host_module(stage: str) -> str:
    """The oracle module a host stage runs: the stage's own, or (writeback) the stage functions' module."""
    own = f"csa_conform.oracle.{stage}"
    return own if importlib.util.find_spec(own) is not None else STAGE_FUNCTIONS[stage].__module__


@dataclass
class DeviceStepResult(StepResult):
    """StepResult plus the present_* tensors as produced (device arrays where the device made them)."""

    present: dict[str, object] = field(default_factory=dict)
    launches: list[LaunchRecord] = field(default_factory=list)
    findings: list = field(default_factory=list)  # what a mode of diff found (.kind, .stages, .message)
    probes: list[ProbeLog | ProvidedProbes] = field(default_factory=list)  # a probed run's logs, one per launch


@dataclass(frozen=True)
class Launcher:
    """What every step of one run launches with: the same backend, kernels, provenance and repeat count.

    ``backend`` is called on the first launch only, so an all-host step never touches CUDA.
    ``repeat`` > 1 runs every launch that many times (csa_conform.device.determinism), or every provider call.
    ``herald`` is told the launch in flight before it starts and None when it ended (a worker's note to the
    runner's parent, which judges a launch that kills or outlives the worker by it).
    ``probes``: a probed run's recorder, which gives every launch a log (csa_conform.device.probes), or every
    provider call its probe callback (csa_conform.device.provider).
    ``engine``: the oracle engine of host-fallback stages (None: $CSA_CONFORM_ENGINE, else auto).
    """

    backend: Callable[[], object]
    kernels: KernelDirectory | None
    provenance: RunProvenance
    repeat: int = 1
    provider: Provider | None = None  # a Python provider's calls instead of kernel launches
    herald: Callable[[LaunchRecord | None], None] | None = None
    probes: ProbeRecorder | ProbeCalls | None = None
    engine: str | None = None


class StepRun:
    """The launches and host stages of one step, in pipeline order.

    ``records`` is the records per batch row the caches and scratch reserve; by default the step's own.
    """

    def __init__(self, launcher: Launcher, geometry: StepGeometry, plan: StepPlan, tensors: StepTensors,
                 reference: Mapping[str, Mapping[str, np.ndarray]], case: str, step: int,
                 records: int | None = None):
        self._backend = launcher.backend
        self._guarded: GuardedWrites | None = None
        self.kernels = launcher.kernels
        self.provenance = launcher.provenance
        self.g = geometry
        self.plan = plan
        self.t = tensors
        self.reference = reference
        self.case = case
        self.step = step
        self.repeat = launcher.repeat
        self.provider = launcher.provider
        self.herald = launcher.herald
        self.probes = launcher.probes
        self._engine = launcher.engine
        self.records = records or geometry.next_records
        self.stages: dict[str, dict[str, np.ndarray]] = {}
        self.launches: list[LaunchRecord] = []
        self.findings: list = []
        self.current: str | None = None  # the host stage running
        self._sources: dict[str, ModuleSource] = {}

    def backend(self):
        """The run's backend, seen through this step's guard bands (csa_conform.device.guards)."""
        if self._guarded is None:
            self._guarded = GuardedWrites(self._backend())
        return self._guarded

    # --- what a stage reads (launches.LaunchSite, stages.StageInputs) ---------------------

    @property
    def geometry(self) -> StepGeometry:
        return self.g

    @property
    def engine(self) -> Engine:
        """The oracle engine a host-fallback stage runs with."""
        return resolve_engine(self._engine)

    @property
    def isolated(self) -> bool:
        return self.plan.mode is Mode.ISOLATED

    def on_device(self, stage: str) -> bool:
        return self.plan.placement(stage) == DEVICE

    def input(self, name: str) -> np.ndarray:
        return self.t.host(name)

    def upstream(self, stage: str, tensor: str) -> np.ndarray:
        """An earlier stage's payload as the host stage running now sees it: the oracle's when isolated, but
        for a stage of its own launch the host computed too (csa_conform.device.plan)."""
        if self.isolated and not (self.current is not None and reads_own(self.plan, self.current, stage)):
            return self.reference[stage][tensor]
        return self.stages[stage][tensor]

    def row_failure(self, stage: str, failure: RowFailure | None) -> None:
        """A host stage fed by the device cannot defer: the kernels after it do not check rows."""
        if failure is not None:
            raise ContractError(failure.message, failure.kind)

    def prior_failure(self, stage: str) -> RowFailure | None:
        return None

    def upstream_device(self, stage: str, tensor: str, buffer: str):
        """The device buffer a kernel reads for an earlier stage's tensor."""
        if self.isolated:
            return self.t.upload(buffer, self.reference[stage][tensor])
        return self.t.device(buffer)

    def device_arrays(self, *names: str) -> tuple:
        return tuple(self.t.device(name) for name in names)

    def total(self):
        return self.t.device("total_sequence_length")

    def bias(self) -> np.ndarray:
        g = self.g
        return attention_bias(self.t.host("attention_bias"), (g.batch, g.heads, g.sequence, g.candidate_count))

    # --- the records of what ran -----------------------------------------------------------

    def source(self, module: str) -> ModuleSource:
        """A module as this step compiles it, read from the directory once per step."""
        if module not in self._sources:
            self._sources[module] = self.kernels.module(module)
        return self._sources[module]

    def launch(self, launch: Launch, grid: int, block: int, args: tuple, scratch: dict) -> None:
        backend = self.backend()
        source = self.source(launch.module)
        function = backend.function(source)
        declared = backend.builds[launch.module].block
        grid3, block3 = (int(grid), 1, 1), (int(declared or block), 1, 1)
        record = LaunchRecord(NVRTC_PATH, launch.stages, launch.module, source.entry, source.sha256, grid3, block3,
                              scratch, self.case, self.step)

        def run(arguments: tuple) -> None:
            if self.herald is not None:
                self.herald(record)
            try:  # a backend staggering this run's warps (csa_conform.device.schedule) launches another build
                backend.launch(source.entry, backend.function(source) if getattr(backend, "order", 0) else function,
                               grid3, block3, arguments)
            except KernelFault as fault:
                fault.launch = fault.launch or record
                raise
            if self.herald is not None:
                self.herald(None)

        if self.repeat > 1:
            self.findings += repeat_launch(backend, run, args, self.repeat, entry=source.entry, module=launch.module,
                                           stages=launch.stages, parameters=source.parameters)
        elif isinstance(self.probes, ProbeRecorder):
            log = self.probes.arm(backend, source, function)
            run(args)
            self.probes.collect(backend, source, function, log)
        else:
            run(args)
        self.findings += backend.check(args, entry=source.entry, module=launch.module, stages=launch.stages,
                                       parameters=source.parameters)
        self.record(record)

    def record(self, launch: LaunchRecord) -> None:
        launch = LaunchRecord(**{**launch.__dict__, "case": self.case, "step": self.step})
        self.launches.append(launch)
        self.provenance.record(launch)

    # --- the pipeline ----------------------------------------------------------------------

    def execute(self) -> DeviceStepResult:
        pending = list(self.plan.launches)
        if self.provider is None and pending:
            prebuild = getattr(self.backend(), "prebuild", None)
            if prebuild is not None:
                orders = tuple(sorted({turn(run) for run in range(self.repeat)}))
                prebuild([self.source(launch.module) for launch in pending], orders)
        for stage in stages_for_ratio(self.g.ratio):
            while pending and pending[0].stages[0] == stage.name:
                launch = pending.pop(0)
                if self.provider is not None:
                    self.provider.run(self, launch)
                else:
                    launches.READ_BACKS[launch.read_back](self, launch)
            if stage.role is Role.WRITEBACK:
                self.writeback(stage)
            elif not self.on_device(stage.name):
                self.host_stage(stage)
        present = {name: self.t.produced(name) for name in self.g.output_names if name in STATE_THREADING}
        stages = {stage: self.stages[stage] for stage in STAGE_NAMES if stage in self.stages}
        probes = list(self.probes.logs) if self.probes is not None else []
        return DeviceStepResult(outputs=stages[WRITEBACK.name], stages=stages, present=present, launches=self.launches,
                                findings=self.findings, probes=probes)

    def host_stage(self, stage: Stage) -> None:
        """The oracle's stage on this run's tensors; its operator outputs become the buffers later launches read."""
        self.current = stage.name
        try:
            payload = STAGE_FUNCTIONS[stage.name](self)
        except ContractError as error:
            raise HostStageRejected(stage.name, str(error), error.kind) from None
        finally:
            self.current = None
        self.record(LaunchRecord(HOST_PATH, (stage.name,), module=host_module(stage.name)))
        self.stages[stage.name] = payload
        for output in stage.outputs:
            self.t.put(output, payload[output])

    def writeback(self, stage: Stage) -> None:
        """The operator outputs: the buffers this run wrote (chained), or the oracle's payloads
        when isolated, where writeback only assembles what the other stages were compared on. A provider
        that implements writeback has already put its payload."""
        if stage.name in self.stages:
            return
        if not self.on_device(stage.name):
            self.host_stage(stage)
        elif self.isolated:
            self.stages[stage.name] = STAGE_FUNCTIONS[stage.name](self)
        else:
            self.stages[stage.name] = {name: self.t.host(name) for name in self.g.output_names}
