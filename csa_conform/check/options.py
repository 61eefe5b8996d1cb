"""The options of one device run, shared by every command that runs kernels and by the pytest plugin.

``BuildChoice`` is which kernels, built how; ``RunOptions`` everything else that
shapes the run. The CLI's option groups (csa_conform.cli.options) parse into
them, the plugin fills them from its own options, and both spell a run back
through ``RunOptions.to_argv`` for reproduce lines, so neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from csa_conform._base.case_glob import exact_glob
from csa_conform._base.terminal import shell_join
from csa_conform.device.backend import CUDA, backend_named
from csa_conform.device.kernels import KernelDirectory
from csa_conform.device.provider import is_provider, load_provider
from csa_conform.device.runner import LAUNCH_TIMEOUT, DeviceRunner
from csa_conform.errors import UsageError
from csa_conform.spec import STAGE_NAMES, Mode


@dataclass(frozen=True, kw_only=True)
class BuildChoice:
    """Which kernels, built how, judged how strictly (the build half of ``device_options``)."""

    kernels: str | None = None
    name: str | None = None  # the build, strict or production (csa_conform.device.kernels.BUILDS)
    nvrtc_options: tuple[str, ...] = ()
    strict_ptx: bool = False

    @property
    def provider(self) -> bool:
        """True when the kernels are a Python provider (``python:…``, csa_conform.device.provider)."""
        return is_provider(self.kernels)

    def refusals(self) -> str | None:
        """Why these build options cannot apply to a Python provider (None when they can)."""
        given = [word for word, set_ in (("--build", self.name), ("--nvrtc-option", self.nvrtc_options),
                                         ("--strict-ptx", self.strict_ptx)) if set_]
        if self.provider and given:
            return (f"{', '.join(given)} configure NVRTC builds of a kernel directory; a python: provider is not "
                    "compiled")
        return None

    def directory(self) -> KernelDirectory:
        return KernelDirectory(self.kernels, build=self.name, nvrtc_options=self.nvrtc_options,
                               strict_ptx=self.strict_ptx)

    def words(self) -> list[str]:
        """The options as a command line spells them."""
        words = ["--kernels", self.kernels] if self.kernels else []
        if self.name:
            words += ["--build", self.name]
        words += [f"--nvrtc-option={option}" for option in self.nvrtc_options]
        if self.strict_ptx:
            words.append("--strict-ptx")
        return words

    def describe(self) -> dict[str, Any]:
        """The choice as the results document's ``options`` records it."""
        return {"kernels": self.kernels, "build": self.name, "nvrtc_options": list(self.nvrtc_options),
                "strict_ptx": self.strict_ptx}


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """Everything that shapes a device run: golden file, mode, placement, build, backend, depth.

    ``to_argv`` spells it back as the ``diff`` command line that reproduces one case and stage;
    ``runner`` makes the DeviceRunner it describes; ``describe`` is what a results document records.
    """

    file: str
    mode: Mode
    force_host: frozenset[str]
    ulp: int
    build: BuildChoice = BuildChoice()
    repeat: int = 1
    replay: str | None = None
    tolerance: str | None = None  # --tolerance FILE: also judge every stage against its calibrated envelope
    invariance: tuple[str, ...] = ()
    backend: str = CUDA
    launch_timeout: float = LAUNCH_TIMEOUT
    _first: list[DeviceRunner] = field(default_factory=list, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        refusal = self.build.refusals()
        if refusal is None and self.build.provider and self.backend != CUDA:
            refusal = (f"--backend {self.backend} chooses where a kernel directory launches; a python: provider "
                       "declares its own device")
        if refusal is None and self.build.provider and self.replay:
            refusal = (f"--replay {self.replay} captures kernel launches on a CUDA graph; a python: provider "
                       "launches its own work")
        if refusal is not None:
            raise UsageError(refusal)

    def __getstate__(self) -> dict[str, Any]:
        """A --devices worker gets the options without the parent's runner (its worker process is the parent's)."""
        return {**self.__dict__, "_first": []}

    @property
    def forced(self) -> str:
        """The force-host set as --force-host spells it ('' when empty)."""
        if self.force_host >= set(STAGE_NAMES):
            return "all"
        return ",".join(stage for stage in STAGE_NAMES if stage in self.force_host)

    def device_words(self) -> list[str]:
        """What runs the kernels, as every device command spells it: --force-host, the build, --backend, --ulp."""
        words = ["--force-host", self.forced] if self.force_host else []
        words += self.build.words()
        if self.backend != CUDA:
            words += ["--backend", self.backend]
        if self.ulp:
            words += ["--ulp", str(self.ulp)]
        if self.launch_timeout != LAUNCH_TIMEOUT:
            words += ["--launch-timeout", f"{self.launch_timeout:g}"]
        return words

    def to_argv(self, case: str, stage: str, mode: Mode | None = None) -> list[str]:
        """The reproducing ``csa-conform diff`` command of one case and stage, as words."""
        words = ["csa-conform", "diff", self.file, "--stage", stage, "--mode", (mode or self.mode).value,
                 "--case", exact_glob(case), *self.device_words()]
        if self.repeat > 1:
            words += ["--repeat", str(self.repeat)]
        if self.replay:
            words += ["--replay", self.replay]
        if self.tolerance:
            words += ["--tolerance", self.tolerance]
        for kind in self.invariance:
            words += ["--invariance", kind]
        return words

    def command(self, case: str, stage: str, mode: Mode | None = None) -> str:
        """``to_argv`` as one shell-quoted line."""
        return shell_join(self.to_argv(case, stage, mode))

    def fault_command(self, case: str, stage: str, mode: Mode | None = None) -> str:
        """The command that reproduces a launch that faulted or hung: on CUDA under compute-sanitizer's
        memcheck, which names the faulting access (the host backend has no sanitizer: the plain command)."""
        words = self.to_argv(case, stage, mode)
        return shell_join(words + ["--sanitize", "memcheck"] if self.backend == CUDA else words)

    def runner(self, mode: Mode | None = None) -> DeviceRunner:
        """The runner of a command: isolated, so a kernel that faults or hangs is a case's verdict (a Python
        provider runs in this process: it owns its device, and a CUDA context made before a fork is unusable).
        A later isolated runner of the same command (explain's re-runs after the diff, bisect's) is a sibling of
        the first: it runs in the first's worker, where NVRTC built every module already."""
        if self.build.kernels is not None and self.build.provider:
            return DeviceRunner(None, mode=mode or self.mode, force_host=self.force_host, repeat=self.repeat,
                                provider=load_provider(self.build.kernels))
        mode = Mode(mode or self.mode)
        if self._first and mode is Mode.ISOLATED and self.repeat == 1 and not self.replay:
            return self._first[0].sibling(self.force_host)  # the worker that built the modules already
        runner = DeviceRunner(self.build.directory(), mode=mode, force_host=self.force_host,
                              backend_factory=backend_named(self.backend), repeat=self.repeat, replay=self.replay,
                              isolate=True, launch_timeout=self.launch_timeout)
        if not self._first:
            self._first.append(runner)
        return runner

    def describe(self) -> dict[str, Any]:
        """The run's options as the results document records them."""
        return {"mode": self.mode.value, "force_host": [stage for stage in STAGE_NAMES if stage in self.force_host],
                **self.build.describe(), "ulp": self.ulp, "repeat": self.repeat, "replay": self.replay,
                **({"tolerance": self.tolerance} if self.tolerance else {}), "invariance": list(self.invariance)}
