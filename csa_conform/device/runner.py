"""One operator step on the device kernels, answered in the oracle's shape.

``DeviceRunner.run_step(attrs, inputs, output_names)`` returns a StepResult
like ``csa_conform.oracle.run_step`` does: operator outputs plus the boundary
payload of every stage (specs/stage-payloads.md), here read back from the buffers and
scratch the runner owns, so ``diff`` never cares which side it compares.
The stages of a step run in csa_conform.device.step, their kernel launches
in csa_conform.device.launches; this module owns what outlives a step: the
kernel directory, the mode and force-host set, the backend (csa_conform.device.backend:
CUDA, or the host emulation) and the run's provenance. A Python provider
(csa_conform.device.provider) takes the kernel directory's place: its calls
replace the launches, the stages it lacks join the force-host set.

An ``isolate``d runner runs its steps in a worker process (csa_conform._base.pool.Worker)
and never launches, or holds a device context, itself: a kernel that kills the worker
(a signal on the host), leaves it a dead CUDA context or outlives ``launch_timeout``
is that step's KernelFault, and the next step gets a fresh worker. Device buffers a
step leaves for the next (chained state) stay in the worker, named by handles.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from csa_conform._base.pool import Worker, WorkerLost
from csa_conform._base.statuses import FAULT, HANG
from csa_conform.contract import validate_step
from csa_conform.device.backend import CUDA, Backend, backend_named
from csa_conform.device.determinism import PoisonedScratch
from csa_conform.device.kernels import MODULES, KernelDirectory
from csa_conform.device.launches import kernel_of, reserved_caches
from csa_conform.device.plan import StepPlan, plan_step
from csa_conform.device.probes import ENTRY_HEADER, PROBE_DEFINE, ROOM_PER_ELEMENT, ProbeRecorder, room_for
from csa_conform.device.provenance import RunProvenance
from csa_conform.device.provider import ProbeCalls, Provider
from csa_conform.device.recorder import LAUNCH_STAGES, LaunchRecorder
from csa_conform.device.replay import Replayer
from csa_conform.device.step import DeviceStepResult, Launcher, StepRun
from csa_conform.device.tensors import StepTensors
from csa_conform.errors import (CorruptedWorker, CsaConformError, KernelFault, UsageError, WorkerCrashed,
                                error_line)
from csa_conform.spec import Mode

__all__ = ["DeviceRunner", "DeviceStepResult"]

# --launch-timeout's default: far above any launch of the committed suites on the host backend (seconds).
LAUNCH_TIMEOUT = 300.0
_KERNEL_CODE_RAN = False  # in a worker: a kernel has been launched in this process
SiblingKey = tuple[frozenset[str], bool, str | None]  # a sibling runner's force-host set, probing and engine


@dataclass(frozen=True)
class Held:
    """A device buffer a step left in the worker (a chained present_* tensor), as the parent names it."""

    serial: int
    name: str


class DeviceRunner:
    """Runs steps on one kernel directory under one mode and force-host set; ``repeat`` > 1 runs
    every launch that many times on poisoned scratch (csa_conform.device.determinism), ``replay``
    ("graph") replays each step's launches on a captured graph (csa_conform.device.replay);
    ``probes`` builds the directory with -DCSA_PROBES and reads every launch's probe log back
    (csa_conform.device.probes: the step result's ``probes``); on a provider it hands each call that names
    ``probe`` a callback and keeps what the call shows (csa_conform.device.provider.ProbeCalls). ``engine``
    is the oracle engine of the stages forced to the host (None: $CSA_CONFORM_ENGINE, else auto)."""

    def __init__(
        self,
        kernels: KernelDirectory | None = None,
        *,
        mode: Mode | str = Mode.CHAINED,
        force_host: frozenset[str] | set[str] = frozenset(),
        backend_factory: Callable[[], Backend] | None = None,
        repeat: int = 1,
        replay: str | None = None,
        provider: Provider | None = None,
        isolate: bool = False,
        launch_timeout: float = LAUNCH_TIMEOUT,
        probes: bool = False,
        engine: str | None = None,
    ):
        self.provider = provider
        self.engine = engine
        self.kernels = kernels if kernels is not None or provider is not None else KernelDirectory()
        if probes and (repeat > 1 or replay):
            raise UsageError("a probed run launches each kernel once, eagerly: no --repeat or --replay")
        if probes and self.kernels is not None:
            self.kernels = self.kernels.probed(PROBE_DEFINE)
        self.probes = probes
        self.mode = Mode(mode)
        self.force_host = frozenset(force_host)
        self._backend_factory = backend_factory or backend_named(CUDA)
        if provider is not None:
            self._backend_factory = lambda: provider.transfer
            if replay:
                raise UsageError(f"--replay {replay} captures kernel launches on a CUDA graph; a python: provider "
                                 "launches its own work")
        self._backend: Backend | None = None
        if repeat > 1 and replay:
            raise UsageError("--repeat and --replay check different things: run them separately")
        self.repeat = repeat
        self.replayer = Replayer(self._launch_parameters, LAUNCH_STAGES) if replay else None
        self.provenance = RunProvenance(None, provider.describe() if provider else self.kernels.fingerprint())
        self.launch_timeout = launch_timeout
        forkable = getattr(self._backend_factory, "forkable", None)
        isolate = isolate and (forkable is None or forkable())
        self.worker = Worker(self._serve, launch_timeout) if isolate else None
        self._held: dict[Held, object] = {}  # in the worker: the last step's present_* buffers
        self._serial = 0
        self._herald: Callable | None = None
        self._shares: SiblingKey | None = None  # a sibling's key in the worker it shares
        self._siblings: dict[SiblingKey, DeviceRunner] = {}  # in the worker

    def backend(self) -> Backend:
        """The backend (CUDA unless told), created on the first device launch (never for an all-host run)."""
        if self._backend is None:
            backend = self._backend_factory()
            self.provenance.device = backend.info()
            self.provenance.compiled = backend.builds
            if self.provider is not None:
                self._backend = backend
                return backend
            if self.replayer is not None:
                self.provenance.replay = self.replayer.describe()
                backend = LaunchRecorder(backend)
            self._backend = PoisonedScratch(backend) if self.repeat > 1 else backend
        return self._backend

    def sibling(self, force_host: frozenset[str], probes: bool = False, engine: str | None = None) -> DeviceRunner:
        """An isolated runner on the same kernels and backend kind, with its own force-host set: explain's
        probed and ablated re-runs of a step, which must not touch this runner's provenance. It runs in this
        runner's worker, where the modules are compiled and the device context made already (a worker of its
        own would build both again for every re-run)."""
        runner = DeviceRunner(self.kernels, mode=Mode.ISOLATED, force_host=force_host,
                              backend_factory=self._backend_factory, provider=self.provider,
                              launch_timeout=self.launch_timeout, probes=probes, engine=engine)
        if self.worker is not None:
            runner.worker, runner._shares = self.worker, (frozenset(force_host), probes, engine)
        return runner

    def plan(self, ratio: int) -> StepPlan:
        """Which stage runs where: a provider's stages on it, the ones it lacks on the host oracle."""
        if self.provider is None:
            return plan_step(ratio, self.mode, self.force_host)
        return plan_step(ratio, self.mode, self.force_host | self.provider.lacks(ratio), self.provider.calls(ratio))

    def run_step(
        self,
        attrs: Mapping,
        inputs: Mapping[str, np.ndarray],
        output_names: Sequence[str],
        *,
        reference: Mapping[str, Mapping[str, np.ndarray]] | None = None,
        past: Mapping[str, object] | None = None,
        case: str = "",
        step: int = -1,
        capacity: int | None = None,
    ) -> DeviceStepResult:
        """Run one accepted step; ``reference`` (oracle payloads) is required in isolated mode.

        ``past`` replaces past_* inputs with tensors a previous step produced
        (device arrays stay on the device), which is how a chained stream runs.
        ``capacity`` reserves every record cache and score scratch at that many
        records per batch row (the stream's largest step), as a provider that
        replays graphs does: then every step of a stream passes the same
        extents, and one graph serves all its steps of one launch shape.
        """
        if self.worker is not None:
            return self._isolated(attrs, inputs, output_names, reference, past, case, step, capacity)
        return self._run(attrs, inputs, output_names, reference, past, case, step, capacity)

    def _isolated(self, *request) -> DeviceStepResult:
        """The step in the worker; its launches recorded here as they are there."""
        if not self.worker.running:
            prepare = getattr(self._backend_factory, "prepare", None)
            if prepare is not None:
                prepare()  # what every worker shares (the host backend's build folder), made once, here
        try:
            asked = ("step", request) if self._shares is None else ("sibling", (self._shares, request))
            result, device, builds, replay = self.worker.call(asked)
        except KernelFault:
            self._device_of(self.worker.note)
            raise
        except WorkerLost as lost:
            self._device_of(lost.note)
            if lost.note is None:
                raise WorkerCrashed(f"the worker process that runs the kernels died outside any launch ({lost})"
                                    ) from None
            if lost.hung:
                raise KernelFault(HANG, f"no end after {self.launch_timeout:g} s (--launch-timeout)",
                                  lost.note[0]) from None
            raise KernelFault(FAULT, lost.signal or str(lost), lost.note[0]) from None
        self.provenance.device = self.provenance.device or device
        self.provenance.compiled.update(builds)
        if replay is not None:
            self.provenance.replay = replay
        for launch in result.launches:
            self.provenance.record(launch)
        return result

    def _device_of(self, note) -> None:
        """The device a lost step's last launch note names, for a run none of whose steps came back."""
        if note is not None and self.provenance.device is None:
            self.provenance.device = note[1]

    def offers(self, name: str) -> bool:
        """Whether the backend has the optional operation ``name`` (explain's ``evaluate_libm``)."""
        if self.worker is None:
            return callable(getattr(self.backend(), name, None))
        return self._backend_request(("offers", name))

    def backend_call(self, name: str, *args):
        """The backend's operation ``name`` where the backend lives (an isolated runner's worker)."""
        if self.worker is None:
            return getattr(self.backend(), name)(*args)
        return self._backend_request(("call", (name, args)))

    def _backend_request(self, request: tuple):
        try:
            return self.worker.call(request)
        except WorkerLost as lost:
            raise WorkerCrashed(f"the worker process that runs the kernels died ({lost})") from None

    def _serve(self, request: tuple, herald: Callable):
        """In the worker: a step (its device outputs kept here and handed out as Held handles), or a backend
        request. An error no code path expects, raised after kernel code ran in this process's own memory, is
        a corrupted worker, not csa-conform's bug (csa_conform.errors.CorruptedWorker)."""
        def heard(note):
            global _KERNEL_CODE_RAN
            _KERNEL_CODE_RAN = _KERNEL_CODE_RAN or note is not None
            herald(note)

        try:
            return self._answer(request, heard)
        except CsaConformError:
            raise
        except Exception as error:  # noqa: BLE001 - named as the worker's, where a kernel could have caused it
            if _KERNEL_CODE_RAN and getattr(self._backend, "in_process", False):
                raise CorruptedWorker(error_line(error)) from error
            raise

    def _answer(self, request: tuple, herald: Callable):
        kind, payload = request
        if kind == "offers":
            return callable(getattr(self.backend(), payload, None))
        if kind == "call":
            name, args = payload
            return getattr(self.backend(), name)(*args)
        if kind == "sibling":
            return self._sibling_step(*payload, herald)
        attrs, inputs, output_names, reference, past, case, step, capacity = payload
        past = {name: self._held[value] if isinstance(value, Held) else value
                for name, value in (past or {}).items()}
        self._herald = lambda launch: herald(None if launch is None else (launch, self.provenance.device))
        result = self._run(attrs, inputs, output_names, reference, past, case, step, capacity)
        self._serial += 1
        self._held = {}
        for name, value in result.present.items():
            if not isinstance(value, np.ndarray):
                result.present[name] = Held(self._serial, name)
                self._held[result.present[name]] = value
        self.provenance.launches.clear()
        return result, self.provenance.device, dict(self.provenance.compiled), self.provenance.replay

    def _sibling_step(self, key: SiblingKey, request: tuple, herald: Callable):
        """In the worker: a sibling's step, on a runner of this process kept per force-host set and probing
        (the process's compiled modules and device context shared); its outputs come back as arrays."""
        runner = self._siblings.get(key)
        if runner is None:
            force_host, probes, engine = key
            runner = self._siblings[key] = DeviceRunner(self.kernels, mode=Mode.ISOLATED, force_host=force_host,
                                                        backend_factory=self._backend_factory,
                                                        provider=self.provider, probes=probes, engine=engine)
        runner._herald = lambda launch: herald(None if launch is None else (launch, runner.provenance.device))
        result = runner._run(*request)
        for name, value in result.present.items():
            if not isinstance(value, np.ndarray):
                result.present[name] = runner.backend().download(value)
        runner.provenance.launches.clear()
        return result, runner.provenance.device, dict(runner.provenance.compiled), runner.provenance.replay

    def _run(self, attrs, inputs, output_names, reference, past, case, step, capacity) -> DeviceStepResult:
        geometry = validate_step(attrs, inputs, output_names)
        plan = self.plan(geometry.ratio)
        if plan.mode is Mode.ISOLATED and reference is None:
            raise UsageError("isolated mode needs the oracle's stage payloads for the step")
        if self.replayer is not None and self._backend is not None:
            self._backend.take_step()  # what a step that raised left recorded is no step to replay
        records = max(capacity or 0, geometry.next_records)
        reserved = reserved_caches(geometry, records) if capacity else {}
        tensors = StepTensors(self.backend, reserved)
        for name, value in inputs.items():
            tensors.put(name, value)
        for name, value in (past or {}).items():
            tensors.put(name, value)
        recorder = None
        if self.probes:
            elements = _probed_elements(geometry)
            recorder = ProbeCalls() if self.provider is not None else ProbeRecorder(room_for(elements))
        launcher = Launcher(self.backend, self.kernels, self.provenance, self.repeat, self.provider, self._herald,
                            recorder, self.engine)
        result = StepRun(launcher, geometry, plan, tensors, reference or {}, case, step, records).execute()
        if self.replayer is not None and self._backend is not None:
            result.findings += self.replayer.step(self._backend, case, step)
            self.provenance.replay = self.replayer.describe()
        return result

    def kernel_of(self, stage: str, ratio: int, tensors=()) -> str | None:
        """What computed a device stage, as a verdict names it: 'module.cu:entry', or a provider's 'name.method'."""
        if self.provider is None:
            return kernel_of(stage, ratio, tensors)
        call = next((call for call in self.provider.calls(ratio) if stage in call.stages), None)
        return None if call is None else f"{self.provider.name}.{call.module}"

    def _launch_parameters(self) -> dict[str, tuple[str, ...]]:
        return {entry: self.kernels.module(module).parameters for module, entry in MODULES.items()}


def _probed_elements(g) -> int:
    """About how many elements a step's probes copy: each record's candidate scores and compressor sub-steps,
    each index query head's, each attention row's softmax, and the one-element entries (header and all) of
    each causal record's index dots, ReLUs and score and of each candidate slot's probability."""
    records = g.batch * (g.emitted + 1)
    scalar = -(-(ENTRY_HEADER + 1) // ROOM_PER_ELEMENT)
    scored = 0
    if g.ratio == 4:
        causal = np.minimum((g.start + np.arange(g.sequence) + 1) // 4, g.next_records)
        scored = g.batch * int(causal.sum()) * (2 * g.index_heads + 1)
    return (records * (g.carry_slots + 8) * (g.dim + g.index_dim)
            + g.batch * g.sequence * (g.index_heads * g.index_dim * 6 + g.heads * 24)
            + scalar * (scored + g.batch * g.sequence * g.heads * g.candidate_count))
