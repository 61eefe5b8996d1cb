"""Device side of csa-conform: kernel directories, mode planning, the CUDA runner, conformance replay.

CuPy is only imported when a stage actually launches (csa_conform.device.cuda).
"""

from csa_conform.device.kernels import MODULES, PRELUDE, KernelDirectory
from csa_conform.device.modes import STAGES, Mode, force_host_from_environment, parse_force_host, plan_step
from csa_conform.device.runner import DeviceRunner, DeviceStepResult

__all__ = [
    "MODULES",
    "PRELUDE",
    "STAGES",
    "DeviceRunner",
    "DeviceStepResult",
    "KernelDirectory",
    "Mode",
    "force_host_from_environment",
    "parse_force_host",
    "plan_step",
]
