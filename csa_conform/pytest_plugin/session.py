"""The golden file as pytest nodes: FILE -> case -> ``stage[oracle]`` and ``stage[device]`` items (and,
with ``--csa-bench-baseline``, a ``bench`` item: csa_conform.pytest_plugin.bench).

Active only with ``--csa-goldens``. Each process (each xdist worker) checks a case at most once
per side and keeps the verdicts for the case's items (csa_conform.pytest_plugin.outcomes).
"""

from __future__ import annotations

import fnmatch
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from csa_conform.check.options import BuildChoice, RunOptions
from csa_conform.device import cuda
from csa_conform.device.backend import CUDA, Backend, backend_named
from csa_conform.device.kernels import KernelDirectory
from csa_conform.device.plan import stages_for_ratio
from csa_conform.device.provider import is_provider, load_provider
from csa_conform.device.runner import DeviceRunner
from csa_conform.errors import CsaConformError, DeviceUnavailable, UsageError, invalid_case
from csa_conform.golden import GoldenFile
from csa_conform.pytest_plugin.bench import SIDE, BenchBaseline, bench_outcome
from csa_conform.pytest_plugin.choices import DEFAULT_BACKEND, DEFAULT_BUILD, DEFAULT_MODE
from csa_conform.pytest_plugin.outcomes import (
    FAILED,
    SKIPPED,
    CaseItems,
    Outcome,
    device_outcomes,
    failed,
    oracle_outcomes,
    skipped,
)
from csa_conform.spec import STAGE_NAMES, Mode

ORACLE, DEVICE, BENCH = "oracle", "device", SIDE
MARKER = "csa_conform"


@dataclass(frozen=True)
class Settings:
    """The command-line options, resolved; ``file`` keeps the user's spelling for reproduce lines."""

    file: str
    kernels: str | None
    build: str
    mode: Mode
    case_glob: str | None
    backend: str = DEFAULT_BACKEND
    bench_baseline: str | None = None

    @property
    def path(self) -> Path:
        return Path(self.file).resolve()


def device_runner(settings: Settings, backend) -> DeviceRunner:
    """The device runner of the device items: the one place ``--csa-build`` reaches the runner. It launches in a
    worker process (a kernel that faults or hangs fails its items, not the pytest session) unless this process
    holds a CUDA context already, which a forked worker could not use: then a sticky CUDA error still fails
    the case's items as a fault, but the context is lost for the session's later cases."""
    kernels = KernelDirectory(settings.kernels, build=settings.build)
    return DeviceRunner(kernels, mode=settings.mode, backend_factory=lambda: backend, isolate=not cuda.initialised)


class NoDevice(Exception):
    """No backend to launch on: the device items are skipped with this reason."""


class GoldenSession:
    """The plugin object registered for one pytest run with ``--csa-goldens``."""

    NAME = "csa-conform-goldens"

    def __init__(self, config: pytest.Config):
        self.config = config
        self.settings = Settings(
            file=config.getoption("csa_goldens"),
            kernels=config.getoption("csa_kernels"),
            build=config.getoption("csa_build") or DEFAULT_BUILD,
            mode=Mode(config.getoption("csa_mode") or DEFAULT_MODE),
            case_glob=config.getoption("csa_case"),
            backend=config.getoption("csa_backend") or DEFAULT_BACKEND,
            bench_baseline=config.getoption("csa_bench_baseline"),
        )
        self.cases = self._cases()
        self.provider = is_provider(self.settings.kernels)
        if self.settings.kernels is not None and not self.provider and not Path(self.settings.kernels).is_dir():
            raise pytest.UsageError(f"--csa-kernels: {self.settings.kernels} is neither a directory nor a "
                                    "python:MODULE:OBJECT provider")
        self.bench: BenchBaseline | None = None
        if self.settings.bench_baseline is not None:
            try:
                self.bench = BenchBaseline.read(self.settings.bench_baseline)
            except CsaConformError as error:
                raise pytest.UsageError(f"--csa-bench-baseline: {error}") from None
        self._oracle: dict[str, dict[str, Outcome]] = {}
        self._device: dict[str, dict[str, Outcome]] = {}
        self._bench: dict[str, Outcome] = {}
        self._backend: Backend | Exception | None = None
        self._runner: DeviceRunner | Exception | None = None
        config.addinivalue_line("markers", f"{MARKER}: an item of the csa-conform golden file (--csa-goldens)")
        if not any(Path(arg.split("::")[0]).resolve() == self.settings.path for arg in config.args):
            config.args.append(self.settings.file)

    def _cases(self) -> dict[str, CaseItems]:
        """Every selected case's items, read once here so a bad file or glob is a usage error."""
        try:
            with GoldenFile(self.settings.file) as golden:
                ids = [case for case in golden.case_ids()
                       if self.settings.case_glob is None or fnmatch.fnmatchcase(case, self.settings.case_glob)]
                if not ids:
                    raise UsageError(f"no case of {self.settings.file} matches {self.settings.case_glob!r}")
                return {case: _case_items(golden, case) for case in ids}
        except CsaConformError as error:
            raise pytest.UsageError(f"--csa-goldens: {error}") from None

    # --- pytest hooks --------------------------------------------------------------------

    def pytest_collect_file(self, file_path: Path, parent: pytest.Collector):
        if file_path.resolve() == self.settings.path:
            return GoldenFileNode.from_parent(parent, path=file_path)
        return None

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        settings = self.settings
        selected = f" matching {settings.case_glob}" if settings.case_glob else ""
        lines = [
            f"csa-conform: goldens {settings.file} ({len(self.cases)} cases{selected}), "
            f"kernels {settings.kernels or 'built-in'}, "
            f"{'a python: provider' if self.provider else f'build {settings.build}'}, mode {settings.mode.value}"
        ]
        if self.bench is not None:
            lines.append(f"csa-conform: bench items gate on {self.bench.file} (mode {self.bench.mode}, "
                         f"time cap {self.bench.time_cap:g} s per row)")
        return lines

    def pytest_terminal_summary(self, terminalreporter) -> None:
        """Say which device the device items ran on, and why any were skipped (whatever -r says)."""
        devices: Counter[str] = Counter()
        reasons: Counter[str] = Counter()
        for status in ("passed", "failed", "skipped"):
            for report in terminalreporter.stats.get(status, []):
                properties = dict(getattr(report, "user_properties", ()))
                if properties.get("csa_side") != DEVICE or report.when != "call":
                    continue
                if "csa_device" in properties:
                    devices[properties["csa_device"]] += 1
                elif status == "skipped":
                    reasons[report.longrepr[2].removeprefix("Skipped: ")] += 1
        for name, count in devices.items():
            terminalreporter.write_line(f"csa-conform: {count} device items ran on {name}")
        for reason, count in reasons.items():
            terminalreporter.write_line(f"csa-conform: {count} device items skipped: {reason}")

    # --- verdicts, once per case and side ------------------------------------------------

    def outcome(self, case: str, stage: str, side: str) -> Outcome:
        if side == BENCH and self.bench is not None:
            if case not in self._bench:
                self._bench[case] = self._bench_case(case, self.bench)
            return self._bench[case]
        if side == ORACLE:
            if case not in self._oracle:
                self._oracle[case] = oracle_outcomes(self.settings.file, self.cases[case])
            return self._oracle[case][stage]
        if case not in self._device:
            self._device[case] = self._device_case(self.cases[case])
        return self._device[case][stage]

    def _device_case(self, case: CaseItems) -> dict[str, Outcome]:
        runner = self.runner()
        if isinstance(runner, NoDevice):
            return {stage: skipped(f"no device: {runner}") for stage in case.stages}
        if isinstance(runner, Exception):
            return {stage: failed([f"{case.case_id} / {stage}: {runner}"]) for stage in case.stages}
        build = BuildChoice(kernels=self.settings.kernels, name=None if self.provider else self.settings.build)
        options = RunOptions(file=self.settings.file, mode=self.settings.mode, force_host=frozenset(), ulp=0,
                             build=build, backend=CUDA if self.provider else self.settings.backend)
        return device_outcomes(self.settings.file, case, runner, options.command, options.fault_command)

    def _bench_case(self, case: str, baseline: BenchBaseline) -> Outcome:
        if self.provider:
            return skipped("bench items time a kernel directory's launches; time a python: provider with "
                           "csa-conform bench")
        backend = self.backend()
        if isinstance(backend, NoDevice):
            return skipped(f"no device: {backend}")
        if isinstance(backend, Exception):
            return failed([f"{case} / bench: {backend}"])
        settings = self.settings
        try:
            return bench_outcome(settings.file, case, baseline, settings.kernels, settings.build, settings.backend,
                                 lambda: backend)
        except CsaConformError as error:
            return failed([f"{case} / bench: {error}"])

    def backend(self) -> Backend | Exception:
        """This process's backend, or why there is none (NoDevice: skip; anything else: fail)."""
        if self._backend is None:
            backend = self.config.hook.pytest_csa_conform_backend(config=self.config)
            try:
                if backend is None:
                    try:
                        backend = backend_named(self.settings.backend)()
                    except DeviceUnavailable as error:
                        raise NoDevice(str(error)) from None
                self._backend = backend
            except (NoDevice, CsaConformError) as error:
                self._backend = error
        return self._backend

    def runner(self) -> DeviceRunner | Exception:
        """This process's runner, or why there is none (NoDevice: skip; anything else: fail)."""
        if self._runner is None and self.provider:
            try:
                provider = load_provider(self.settings.kernels)
                self._runner = DeviceRunner(None, mode=self.settings.mode, provider=provider)
            except DeviceUnavailable as error:
                self._runner = NoDevice(str(error))
            except CsaConformError as error:
                self._runner = error
        if self._runner is None:
            backend = self.backend()
            if isinstance(backend, Exception):
                self._runner = backend
            else:
                try:
                    self._runner = device_runner(self.settings, backend)
                except CsaConformError as error:
                    self._runner = error
        return self._runner

    def device_name(self) -> str | None:
        runner = self.runner()
        if isinstance(runner, Exception) or runner.provenance.device is None:
            return None
        return runner.provenance.device.name


def _case_items(golden: GoldenFile, case_id: str) -> CaseItems:
    """A case's items; a case that cannot be read is one validation item, which fails with the reason."""
    try:
        info = golden.case_info(case_id)
    except CsaConformError as error:
        if not invalid_case(error):
            raise
        return CaseItems(case_id, (), validation=True)
    accepted = info.step_count > len(info.errors)
    ratio = info.attrs.get("compression_ratio")
    stages = (stages_for_ratio(ratio) if ratio in (4, 128) else STAGE_NAMES) if accepted else ()
    return CaseItems(case_id, stages, validation=bool(info.errors))


class GoldenFileNode(pytest.File):
    def collect(self):
        session = self.config.pluginmanager.get_plugin(GoldenSession.NAME)
        for case in session.cases.values():
            yield CaseNode.from_parent(self, name=case.case_id, case=case)


class CaseNode(pytest.Collector):
    def __init__(self, *, case: CaseItems, **kwargs):
        super().__init__(**kwargs)
        self.case = case

    def collect(self):
        sides = [(stage, ORACLE) for stage in self.case.oracle if stage not in self.case.stages]
        sides += [(stage, side) for stage in self.case.stages for side in (ORACLE, DEVICE)]
        for stage, side in sides:
            yield StageItem.from_parent(self, name=f"{stage}[{side}]", case=self.case.case_id, stage=stage, side=side)
        if self.config.pluginmanager.get_plugin(GoldenSession.NAME).bench is not None and self.case.stages:
            yield StageItem.from_parent(self, name=BENCH, case=self.case.case_id, stage=BENCH, side=BENCH)


class ConformanceFailure(Exception):
    """An item's diagnosis: the lines ``verify`` or ``diff`` print for it, reproduce command included."""


class StageItem(pytest.Item):
    def __init__(self, *, case: str, stage: str, side: str, **kwargs):
        super().__init__(**kwargs)
        self.case, self.stage, self.side = case, stage, side
        self.add_marker(MARKER)
        self.user_properties += [("csa_case", case), ("csa_stage", stage), ("csa_side", side)]

    def runtest(self) -> None:
        session = self.config.pluginmanager.get_plugin(GoldenSession.NAME)
        outcome = session.outcome(self.case, self.stage, self.side)
        if self.side in (DEVICE, BENCH) and outcome.status != SKIPPED and session.device_name():
            self.user_properties.append(("csa_device", session.device_name()))
        if outcome.status == FAILED:
            raise ConformanceFailure(outcome.text)
        if outcome.status == SKIPPED:
            pytest.skip(outcome.text)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, ConformanceFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, f"{self.case} {self.stage} [{self.side}]"
