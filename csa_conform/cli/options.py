"""Option groups the commands share, so a flag is spelled, parsed and documented once.

``golden_file`` + ``case_selection`` pick what to check, ``engine_option`` which oracle engine, ``stage_option``
which stages (any spelling the registry knows), ``device_options`` how the
device run is set up, ``device_depth_options`` what more than one eager run
checks (specs/device-depth.md), ``output_options`` how results are shown.

Each group hands the command one value: ``device_options`` a DeviceOptions (``device``): --force-host,
``build``, a BuildChoice (`--kernels DIR`, default the built-in kernels; `--build strict|production`,
`--nvrtc-option OPT`, repeatable; `--strict-ptx`: one value that makes the KernelDirectory and spells
itself back for the reproduce commands), the backend (cuda or host), --ulp and --git-bisect;
``device_depth_options`` a DepthOptions (``depth``); ``output_options`` an OutputOptions (``output``).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Callable

import click

from csa_conform._base.resources import ci_goldens
from csa_conform._base.shards import (
    NODE_INDEX_ENV,
    NODE_TOTAL_ENV,
    SHARD_ENV,
    Shard,
    parse_shard,
    shard_from_environment,
)
from csa_conform.check.options import BuildChoice, RunOptions
from csa_conform.device.backend import BACKENDS, CUDA
from csa_conform.device.devices import parse_devices
from csa_conform.device.kernels import BUILDS, MANIFEST
from csa_conform.device.plan import force_host_from_environment, parse_force_host
from csa_conform.device.replay import REPLAY_MODES
from csa_conform.device.runner import LAUNCH_TIMEOUT
from csa_conform.device.sanitizer import TOOLS as SANITIZER_TOOLS
from csa_conform.errors import UsageError
from csa_conform.oracle.engine import ENGINE_CHOICES
from csa_conform.spec import PIPELINE, STAGE_NAMES, Mode, resolve_stage

DEFAULT_FILE = str(ci_goldens())
STAGE_CHOICES = "all, " + ", ".join(f"{stage.label} ({stage.name})" for stage in PIPELINE)


def compose(*decorators: Callable) -> Callable:
    def apply(function: Callable) -> Callable:
        for decorator in reversed(decorators):
            function = decorator(function)
        return function

    return apply


def golden_file(default: str | None = None) -> Callable:
    """The golden file argument; commands that run the packaged suite by default pass ``default``."""
    if default is None:
        return click.argument("file", type=click.Path(dir_okay=False))
    return click.argument("file", required=False, default=default, type=click.Path(dir_okay=False))


def jobs_option(help: str = "Worker processes.") -> Callable:
    return click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True, help=help)


def quiet_option(help: str) -> Callable:
    return click.option("-q", "--quiet", is_flag=True, help=help)


def case_selection(exact: bool = False, without: str | None = None) -> Callable:
    """--case: a glob over case ids, or (``exact``) one case id, required unless ``without`` says what
    the command does without one."""
    if exact:
        return click.option("--case", "case", required=without is None, default=None, metavar="ID",
                            help="Case id of the stream" + (f" (default: {without})." if without else "."))
    return click.option("--case", "case_glob", default=None, metavar="GLOB", help="Only cases whose id matches GLOB.")


class StageList(click.ParamType):
    """'all', or stages by name, short name, number or number:short ('select', '5', '5:select'), comma-separated."""

    name = "STAGE"

    def convert(self, value, param, ctx) -> tuple[str, ...]:
        if isinstance(value, tuple):
            return value
        words = [word.strip() for word in str(value).split(",") if word.strip()]
        if words == ["all"]:
            return STAGE_NAMES
        chosen = set()
        for word in words:
            stage = resolve_stage(word)
            if stage is None:
                self.fail(f"{word!r} is not a stage; choose {STAGE_CHOICES}", param, ctx)
            chosen.add(stage.name)
        if not chosen:
            self.fail(f"no stage given; choose {STAGE_CHOICES}", param, ctx)
        return tuple(name for name in STAGE_NAMES if name in chosen)


class OneStage(StageList):
    """One stage, spelled as for StageList, or one of ``groups`` (inspect's 'inputs', 'outputs')."""

    def __init__(self, groups: tuple[str, ...] = ()):
        self.groups = groups

    def convert(self, value, param, ctx) -> str:
        if value in self.groups:
            return value
        stages = super().convert(value, param, ctx)
        if value == "all" or len(stages) != 1:
            self.fail(f"{value!r}: give one stage{''.join(f', or {group}' for group in self.groups)}", param, ctx)
        return stages[0]


def stage_option(function: Callable) -> Callable:
    return click.option(
        "--stage", "stages", type=StageList(), default="all", show_default=True,
        help=f"Stages to compare, comma-separated, by name, short name or number: {STAGE_CHOICES}.",
    )(function)


def effective_force_host(option: str | None) -> frozenset[str]:
    """--force-host plus the environment switches (CSA_CONFORM_FORCE_HOST, ONNX_GENAI_CSA_FORCE_HOST)."""
    try:
        return parse_force_host(option) | force_host_from_environment()
    except UsageError as error:
        raise click.BadParameter(str(error), param_hint="--force-host") from None


@dataclass(frozen=True, kw_only=True)
class DeviceOptions:
    """What ``device_options`` parsed: --force-host as given, the kernels and their build, the backend, --ulp
    and --git-bisect. ``run_options`` is the one place a command turns them into RunOptions."""

    force_host: str | None
    build: BuildChoice
    backend: str
    ulp: int
    git_bisect: bool
    launch_timeout: float = LAUNCH_TIMEOUT

    def run_options(self, file: str, *, mode: Mode = Mode.CHAINED, depth: DepthOptions | None = None,
                    tolerance: str | None = None, invariance: tuple[str, ...] = ()) -> RunOptions:
        """The RunOptions every device run takes (with the depth options where the command has them);
        --force-host gets the environment's stages."""
        depth = depth or DepthOptions()
        if self.build.provider and depth.sanitize:
            raise UsageError(f"--sanitize {depth.sanitize}: compute-sanitizer attaches to kernel launches of a "
                             "kernel directory, not to a python: provider's process")
        return RunOptions(file=file, mode=mode, force_host=effective_force_host(self.force_host), ulp=self.ulp,
                          build=self.build, repeat=depth.repeat, replay=depth.replay, tolerance=tolerance,
                          invariance=tuple(dict.fromkeys(invariance)), backend=self.backend,
                          launch_timeout=self.launch_timeout)


@dataclass(frozen=True, kw_only=True)
class DepthOptions:
    """What ``device_depth_options`` parsed: --repeat, --replay, --sanitize, --shard as given, --devices
    (False when not given)."""

    repeat: int = 1
    replay: str | None = None
    sanitize: str | None = None
    shard: str | None = None
    devices: tuple[int, ...] | bool | None = False  # None: every GPU of the host


@dataclass(frozen=True, kw_only=True)
class OutputOptions:
    """What ``output_options`` parsed: --json and --quiet."""

    as_json: bool
    quiet: bool


def _device_group(command: Callable) -> Callable:
    @functools.wraps(command)
    def wrapped(*args, kernels, build_name, nvrtc_options, strict_ptx, force_host, backend, ulp, git_bisect,
                launch_timeout, **kwargs):
        build = BuildChoice(kernels=kernels, name=build_name, nvrtc_options=tuple(nvrtc_options), strict_ptx=strict_ptx)
        return command(*args, device=DeviceOptions(force_host=force_host, build=build, backend=backend, ulp=ulp,
                                                   git_bisect=git_bisect, launch_timeout=launch_timeout), **kwargs)

    return wrapped


def grouped(keyword: str, group: type) -> Callable:
    """Hand the command the options named by ``group``'s fields as one value, ``keyword=group(...)``."""
    names = tuple(field.name for field in dataclasses.fields(group))

    def decorate(command: Callable) -> Callable:
        @functools.wraps(command)
        def wrapped(*args, **kwargs):
            values = {name: kwargs.pop(name) for name in names}
            return command(*args, **{keyword: group(**values)}, **kwargs)

        return wrapped

    return decorate


device_options = compose(
    click.option("--force-host", "force_host", default=None, metavar="STAGES",
                 help="Stages (as --stage spells them, or all) to run on the host oracle inside the device run; "
                 "CSA_CONFORM_FORCE_HOST and ONNX_GENAI_CSA_FORCE_HOST add to it."),
    click.option("--kernels", default=None, type=click.Path(file_okay=False),
                 help=f"Kernel directory (block_quant.cuh + one .cu per module, optionally {MANIFEST}); "
                 "default: the built-in kernels shipped with csa-conform."),
    click.option("--build", "build_name", type=click.Choice(list(BUILDS)), default=None,
                 help="strict: --fmad=false --prec-div=true --prec-sqrt=true --ftz=false; production: only "
                 "--gpu-architecture, as the CUDA provider builds. Default: strict for the built-in kernels, "
                 f"else the directory's {MANIFEST}, else production."),
    click.option("--nvrtc-option", "nvrtc_options", multiple=True, metavar="OPT",
                 help="Extra NVRTC option, after the build's (repeatable; e.g. --nvrtc-option=-DMY_SWITCH)."),
    click.option("--strict-ptx", is_flag=True,
                 help="Refuse (exit 4) a module whose PTX holds .ftz, .approx or fused binary32 instructions."),
    _device_group,
    click.option("--backend", type=click.Choice(BACKENDS), default=CUDA, show_default=True,
                 help="Where kernels launch: cuda (device 0, through CuPy/NVRTC), or host (every module built "
                 "with g++ and run on the CPU: no GPU needed; what it cannot show: specs/host-backend.md)."),
    click.option("--ulp", default=0, type=click.IntRange(min=0), show_default=True,
                 help="Accept float differences up to N ULP (packed records and indices stay exact)."),
    click.option("--git-bisect", is_flag=True,
                 help="Exit 125 (git bisect run: skip) when this commit cannot be judged: no device, kernels "
                 "that do not compile, goldens missing, unreadable or of another schema."),
    click.option("--launch-timeout", "launch_timeout", type=click.FloatRange(min=0, min_open=True),
                 default=LAUNCH_TIMEOUT, show_default=True, metavar="SECONDS",
                 help="A kernel launch still running after this long is the case's verdict hang (the process "
                 "that ran it is killed and the run goes on)."),
)

def effective_shard(option: str | None) -> Shard | None:
    """--shard K/N, else the CI's parallel-job variables (csa_conform._base.shards); 1/1 is no shard."""
    try:
        shard = parse_shard(option) if option is not None else shard_from_environment()
    except UsageError as error:
        raise click.BadParameter(str(error), param_hint="--shard") from None
    return None if shard is None or shard.total == 1 else shard


def devices_option(context, param, value):
    """--devices: False when not given, None for 'all', else the ordinals."""
    if value is None:
        return False
    try:
        return parse_devices(value)
    except UsageError as error:
        raise click.BadParameter(str(error)) from None


device_depth_options = compose(
    grouped("depth", DepthOptions),
    click.option("--repeat", default=1, type=click.IntRange(min=1), show_default=True, metavar="N",
                 help="Run every launch N times on fresh scratch poisoned with a different byte pattern per run "
                 "(--backend host: the even runs with blocks and threads in reverse order; CUDA: the later runs "
                 "with the warps leaving every barrier staggered, last warp first, then first warp first); any byte "
                 "that differs between runs is a non-deterministic finding (exit 1)."),
    click.option("--replay", type=click.Choice(REPLAY_MODES), default=None,
                 help="Also replay every step's launches on a CUDA graph captured once per stream, inputs updated "
                 "in place; bytes that differ from the eager run are a replay-mismatch (exit 1)."),
    click.option("--sanitize", type=click.Choice(SANITIZER_TOOLS), default=None,
                 help="Run the diff under NVIDIA compute-sanitizer with this tool; any error it reports is a "
                 "finding (exit 1); exit 4 when compute-sanitizer is not installed."),
    click.option("--shard", default=None, metavar="K/N",
                 help=f"Run only shard K of N (cases split round robin); default from {SHARD_ENV}=K/N or "
                 f"{NODE_INDEX_ENV}/{NODE_TOTAL_ENV}. `report` merges the shards' documents."),
    click.option("--devices", default=None, metavar="0,1,…|all", callback=devices_option,
                 help="Spread the cases over these GPUs of this host, one worker process each; the results "
                 "are those of one GPU."),
)

output_options = compose(
    grouped("output", OutputOptions),
    click.option("--json", "as_json", is_flag=True, help="Print one results document (specs/results-document.md)."),
    quiet_option("No progress, header or table: failures and the summary only."),
)


def engine_option(function: Callable) -> Callable:
    """--engine: which oracle engine runs the host side (the bytes are the same either way)."""
    return click.option(
        "--engine", type=click.Choice(ENGINE_CHOICES), default=None,
        help="Oracle engine, same bytes either way [default: $CSA_CONFORM_ENGINE, else auto].",
    )(function)
