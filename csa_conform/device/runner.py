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
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from csa_conform.contract import validate_step
from csa_conform.device.backend import CUDA, Backend, backend_named
from csa_conform.device.determinism import PoisonedScratch
from csa_conform.device.kernels import MODULES, KernelDirectory
from csa_conform.device.launches import kernel_of, reserved_caches
from csa_conform.device.plan import StepPlan, plan_step
from csa_conform.device.provenance import RunProvenance
from csa_conform.device.provider import Provider
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
    ("graph") replays each step's launches on a captured graph (csa_conform.device.replay)."""

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
    ):
        self.provider = provider
        self.kernels = kernels if kernels is not None or provider is not None else KernelDirectory()
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
        launcher = Launcher(self.backend, self.kernels, self.provenance, self.repeat, self.provider)
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
