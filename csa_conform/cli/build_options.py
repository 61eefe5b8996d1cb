"""The build options shared by `diff` and `bisect`: which kernels, built how, judged how strictly.

`--kernels DIR` (default: the built-in kernels), `--build strict|production`,
`--nvrtc-option OPT` (repeatable) and `--strict-ptx` arrive as one
BuildChoice, which makes the KernelDirectory and spells itself back for the
reproduce commands. The run header shows the build and each module's PTX
report once.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import click

from csa_conform.device.kernels import MANIFEST, PROFILES, KernelDirectory
from csa_conform.device.provenance import RunProvenance


@dataclass(frozen=True)
class BuildChoice:
    kernels: str | None = None
    profile: str | None = None
    nvrtc_options: tuple[str, ...] = ()
    strict_ptx: bool = False

    def directory(self) -> KernelDirectory:
        return KernelDirectory(self.kernels, build=self.profile, nvrtc_options=self.nvrtc_options,
                               strict_ptx=self.strict_ptx)

    def words(self) -> list[str]:
        """The options as a command line spells them."""
        words = ["--kernels", self.kernels] if self.kernels else []
        if self.profile:
            words += ["--build", self.profile]
        for option in self.nvrtc_options:
            words.append(f"--nvrtc-option={option}")
        if self.strict_ptx:
            words.append("--strict-ptx")
        return words


def build_options(command):
    """Adds --kernels, --build, --nvrtc-option and --strict-ptx; the command receives `build: BuildChoice`."""

    @click.option("--strict-ptx", is_flag=True,
                  help="Refuse (exit 4) a module whose PTX holds .ftz, .approx or fused binary32 instructions.")
    @click.option("--nvrtc-option", "nvrtc_options", multiple=True, metavar="OPT",
                  help="Extra NVRTC option, after the build's (repeatable; e.g. --nvrtc-option=-DMY_SWITCH).")
    @click.option("--build", "profile", type=click.Choice(list(PROFILES)), default=None,
                  help="strict: --fmad=false --prec-div=true --prec-sqrt=true --ftz=false; production: only "
                  "--gpu-architecture, as the CUDA provider builds. Default: strict for the built-in kernels, "
                  f"else the directory's {MANIFEST}, else production.")
    @click.option("--kernels", default=None, type=click.Path(file_okay=False),
                  help=f"Kernel directory (block_quant.cuh + the seven .cu modules, optionally {MANIFEST}); "
                  "default: the built-in kernels shipped with csa-conform.")
    @functools.wraps(command)
    def wrapped(*args, kernels, profile, nvrtc_options, strict_ptx, **kwargs):
        return command(*args, build=BuildChoice(kernels, profile, tuple(nvrtc_options), strict_ptx), **kwargs)

    return wrapped


def build_lines(provenance: RunProvenance) -> list[str]:
    """The build and, per compiled module, its options and PTX report (text header)."""
    build = provenance.kernels["build"]
    lines = [f"build {build['profile']} ({build['origin']}): {' '.join(build['options']) or 'no options'}"
             + (", strict PTX" if build["strict_ptx"] else "")]
    for name, module in sorted(provenance.modules.items()):
        report = "no PTX (host emulation)" if module.ptx is None else module.ptx.summary()
        lines.append(f"  {name}: {' '.join(module.options)}")
        lines.append(f"    ptx: {report}")
    return lines
