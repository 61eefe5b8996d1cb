"""One operator step on the device kernels, answered in the oracle's shape.

``DeviceRunner.run_step(attrs, inputs, output_names)`` returns a StepResult
like ``csa_conform.oracle.run_step`` does: operator outputs plus the boundary
payload of every stage (specs/stage-payloads.md), here read back from the buffers and
scratch the runner owns, so ``diff`` never cares which side it compares.
The stages of a step run in csa_conform.device.step, their kernel launches
in csa_conform.device.launches; this module owns what outlives a step: the
kernel directory, the mode and force-host set, the backend (csa_conform.device.backend:
CUDA, or the host emulation) and the run's provenance.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from csa_conform.contract import validate_step
from csa_conform.device.backend import CUDA, Backend, backend_named
from csa_conform.device.determinism import PoisonedScratch
from csa_conform.device.kernels import MODULES, KernelDirectory
from csa_conform.device.launches import reserved_caches
from csa_conform.device.plan import StepPlan, plan_step
from csa_conform.device.probes import PROBE_DEFINE, ProbeRecorder, room_for
from csa_conform.device.provenance import RunProvenance
from csa_conform.device.recorder import LAUNCH_STAGES, LaunchRecorder
from csa_conform.device.replay import Replayer
from csa_conform.device.step import DeviceStepResult, Launcher, StepRun
from csa_conform.device.tensors import StepTensors
from csa_conform.errors import UsageError
from csa_conform.spec import Mode

__all__ = ["DeviceRunner", "DeviceStepResult"]

class DeviceRunner:
    """Runs steps on one kernel directory under one mode and force-host set; ``repeat`` > 1 runs
    every launch that many times on poisoned scratch (csa_conform.device.determinism), ``replay``
    ("graph") replays each step's launches on a captured graph (csa_conform.device.replay);
    ``probes`` builds the directory with -DCSA_PROBES and reads every launch's probe log back
    (csa_conform.device.probes: the step result's ``probes``)."""

    def __init__(
        self,
        kernels: KernelDirectory | None = None,
        *,
        mode: Mode | str = Mode.CHAINED,
        force_host: frozenset[str] | set[str] = frozenset(),
        backend_factory: Callable[[], Backend] | None = None,
        repeat: int = 1,
        replay: str | None = None,
        probes: bool = False,
    ):
        self.kernels = kernels if kernels is not None else KernelDirectory()
        if probes and (repeat > 1 or replay):
            raise UsageError("a probed run launches each kernel once, eagerly: no --repeat or --replay")
        if probes:
            self.kernels = self.kernels.probed(PROBE_DEFINE)
        self.probes = probes
        self.mode = Mode(mode)
        self.force_host = frozenset(force_host)
        self._backend_factory = backend_factory or backend_named(CUDA)
        self._backend: Backend | None = None
        if repeat > 1 and replay:
            raise UsageError("--repeat and --replay check different things: run them separately")
        self.repeat = repeat
        self.replayer = Replayer(self._launch_parameters, LAUNCH_STAGES) if replay else None
        self.provenance = RunProvenance(None, self.kernels.fingerprint())

    def backend(self) -> Backend:
        """The backend (CUDA unless told), created on the first device launch (never for an all-host run)."""
        if self._backend is None:
            backend = self._backend_factory()
            self.provenance.device = backend.info()
            self.provenance.compiled = backend.builds
            if self.replayer is not None:
                self.provenance.replay = self.replayer.describe()
                backend = LaunchRecorder(backend)
            self._backend = PoisonedScratch(backend) if self.repeat > 1 else backend
        return self._backend

    def sibling(self, force_host: frozenset[str], probes: bool = False) -> DeviceRunner:
        """An isolated runner on the same kernels and backend kind, with its own force-host set: explain's
        probed and ablated re-runs of a step, which must not touch this runner's provenance."""
        return DeviceRunner(self.kernels, mode=Mode.ISOLATED, force_host=force_host,
                            backend_factory=self._backend_factory, probes=probes)

    def plan(self, ratio: int) -> StepPlan:
        return plan_step(ratio, self.mode, self.force_host)

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
        recorder = ProbeRecorder(room_for(_probed_elements(geometry))) if self.probes else None
        launcher = Launcher(self.backend, self.kernels, self.provenance, self.repeat, recorder)
        result = StepRun(launcher, geometry, plan, tensors, reference or {}, case, step, records).execute()
        if self.replayer is not None and self._backend is not None:
            result.findings += self.replayer.step(self._backend, case, step)
            self.provenance.replay = self.replayer.describe()
        return result

    def _launch_parameters(self) -> dict[str, tuple[str, ...]]:
        return {entry: self.kernels.module(module).parameters for module, entry in MODULES.items()}


def _probed_elements(g) -> int:
    """About how many elements a step's probes copy: each record's candidate scores and compressor sub-steps,
    each index query head's, and each attention row's softmax (entry headers counted there: one element
    each)."""
    records = g.batch * (g.emitted + 1)
    return (records * (g.carry_slots + 8) * (g.dim + g.index_dim)
            + g.batch * g.sequence * (g.index_heads * g.index_dim * 6 + g.heads * 24))
