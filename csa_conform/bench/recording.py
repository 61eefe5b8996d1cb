"""What the conformance run launched, kept so the very same launches can be timed.

``RecordingRunner`` is the device runner with its backend wrapped: every
launch is remembered with its function, grid, block and arguments, and with
the buffers allocated for it since the launch before (its outputs and
scratch, each with the ABI's pre-fill or none). After each step the runner
keeps that step's launches and a download of every buffer they own: the
bytes the conformance check compared with the oracle. The bench times the
last step a case runs (its longest context) on exactly these buffers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from csa_conform.contract import StepGeometry, validate_step
from csa_conform.device.backend import Backend
from csa_conform.device.kernels import KernelDirectory
from csa_conform.device.recorder import LaunchRecorder, RecordedLaunch
from csa_conform.device.runner import DeviceRunner, DeviceStepResult


@dataclass
class StepLaunches:
    """One step's launches, its geometry, and the bytes every owned buffer held after the conformance run."""

    step: int
    geometry: StepGeometry
    launches: list[RecordedLaunch]
    expected: dict[int, np.ndarray] = field(default_factory=dict)  # id(buffer) -> bytes after the step


def _bytes(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


class RecordingRunner(DeviceRunner):
    """The device runner (chained, nothing forced to the host) that keeps its last step's launches."""

    def __init__(self, kernels: KernelDirectory, backend_factory: Callable[[], Backend]):
        super().__init__(kernels, backend_factory=lambda: LaunchRecorder(backend_factory()))
        self.last: StepLaunches | None = None

    @property
    def recorder(self) -> LaunchRecorder | None:
        return self._backend  # type: ignore[return-value]

    def run_step(self, attrs: Mapping, inputs: Mapping[str, np.ndarray], output_names: Sequence[str],
                 **options) -> DeviceStepResult:
        result = super().run_step(attrs, inputs, output_names, **options)
        recorder = self.recorder
        if recorder is not None:
            launches, _ = recorder.take_step()
            if launches:
                expected = {id(owned.buffer): _bytes(recorder.download(owned.buffer)).copy()
                            for launch in launches for owned in launch.owned}
                self.last = StepLaunches(int(options.get("step", -1)), validate_step(attrs, inputs, output_names),
                                         launches, expected)
        return result
