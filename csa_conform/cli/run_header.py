"""What a device run's text output starts with, the same for diff, bisect and explain: the options,
the kernels, the device, the build and PTX of every module, and the loud banner of a control run."""

from __future__ import annotations

import os

from csa_conform.check.options import RunOptions
from csa_conform.device.plan import FORCE_HOST_ENV, SEED_FORCE_HOST_ENV
from csa_conform.device.provenance import RunProvenance
from csa_conform.spec import STAGE_NAMES


def control_banner(options: RunOptions) -> str:
    """What an all-host run must say loudly: it compared the oracle with itself, not with kernels."""
    sources = []
    if os.environ.get(SEED_FORCE_HOST_ENV, "") not in ("", "0"):
        sources.append(f"{SEED_FORCE_HOST_ENV}={os.environ[SEED_FORCE_HOST_ENV]} (inherited)")
    if os.environ.get(FORCE_HOST_ENV):
        sources.append(f"{FORCE_HOST_ENV}={os.environ[FORCE_HOST_ENV]}")
    why = ", ".join(sources) or f"--force-host {options.forced or 'none'}"
    return (f"CONTROL RUN: no kernel was launched; every compared stage ran on the host oracle ({why}). "
            "This checks the harness, not your kernels.")


def build_lines(provenance: RunProvenance) -> list[str]:
    """The build and, per compiled module, its NVRTC options and PTX report (once per run); for a Python
    provider what it declared and which stages it leaves to the host oracle."""
    provider = provenance.kernels.get("provider")
    if provider is not None:
        host = ", ".join(provider["host_stages"]) or "none"
        return [f"provider {provider['name']} {provider['version']} on {provider['device']}: "
                f"{', '.join(provider['methods'])}; not provided, so run on the host oracle: {host}"]
    build = provenance.kernels["build"]
    lines = [f"build {build['profile']} ({build['origin']}): {' '.join(build['options']) or 'no options'}"
             + (", strict PTX" if build["strict_ptx"] else "")]
    for name, module in sorted(provenance.modules.items()):
        report = "no PTX (host emulation)" if module.ptx is None else module.ptx.summary()
        lines.append(f"  {name}: {' '.join(module.options)}")
        lines.append(f"    ptx: {report}")
    return lines


def run_header(command: str, provenance: RunProvenance, options: RunOptions,
               stages: tuple[str, ...]) -> list[str]:
    """What a device run's text output starts with: options, kernels, device, build and PTX."""
    kernels = provenance.kernels
    device = provenance.device
    where = "host only (no device launch)" if device is None else device.name if "provider" in kernels else (
        f"{device.name} (sm {device.compute_capability}, CUDA runtime {device.cuda_runtime}, "
        f"driver {device.cuda_driver}, NVRTC {device.nvrtc})"
    )
    forced = options.forced or "none"
    return [
        f"csa-conform {command} {options.file}: mode {options.mode.value}, stages "
        f"{'all' if stages == STAGE_NAMES else ','.join(stages)}, ulp {options.ulp}"
        + (f", every launch run {options.repeat} times" if options.repeat > 1 else "")
        + (f", replayed on a CUDA {options.replay}" if options.replay else ""),
        f"kernels {kernels['path']}{' (builtin)' if kernels['builtin'] else ''}; force-host {forced}; device {where}",
        *build_lines(provenance),
    ]
