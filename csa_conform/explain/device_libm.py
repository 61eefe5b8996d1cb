"""The device libm probe: CUDA's binary32 libm (and its double functions rounded once), evaluated on the
run's device with the run's build, for the device-libm hypotheses (csa_conform.explain.hypotheses)."""

from __future__ import annotations

from typing import Callable

from csa_conform.device.runner import DeviceRunner
from csa_conform.errors import DeviceUnavailable


def device_libm(runner: DeviceRunner) -> tuple[Callable[[str], Callable] | None, str | None]:
    """CUDA's libm on this run's device (compiled with the run's build), or why it is unavailable."""
    try:
        backend = runner.backend()
    except DeviceUnavailable as error:
        return None, f"no CUDA device: {error}"
    probe = getattr(backend, "evaluate_libm", None)
    if probe is None:
        return None, (f"{backend.info().name} has no CUDA libm to evaluate; its stand-in for the platform libm "
                      "is correctly rounded, which the correctly-rounded hypotheses cover")
    build = runner.kernels.build

    def function(name: str) -> Callable:
        return lambda *args: probe(name, args, build)
    return function, None
