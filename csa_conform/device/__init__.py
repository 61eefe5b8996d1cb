"""Device side of csa-conform: kernel directories, stage placement, the CUDA and host runners.

It runs kernels and reads their buffers back; judging them is csa_conform.check's.

CuPy is only imported when a stage actually launches (csa_conform.device.cuda).
"""

from csa_conform.device.kernels import MODULES, PRELUDE, KernelDirectory
from csa_conform.device.plan import force_host_from_environment, parse_force_host, plan_step
from csa_conform.device.runner import DeviceRunner, DeviceStepResult

__all__ = [
    "MODULES",
    "PRELUDE",
    "DeviceRunner",
    "DeviceStepResult",
    "KernelDirectory",
    "force_host_from_environment",
    "parse_force_host",
    "plan_step",
]
