"""What ran, where, compiled from what: a record per launch and per host stage.

Like a kernel provider that records which native path served every call, a
device run keeps, for each launch, the module, entry, the sha256 of the exact
source NVRTC compiled, grid, block and the scratch capacities it was given;
and once per run the device, CUDA runtime/driver/NVRTC versions and the
kernel directory's file hashes and build; per module, the exact NVRTC
options it was compiled with and its PTX report. Host-oracle stages are
recorded too, so a report says which stages the device actually computed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from csa_conform.device.ptx import PtxReport

NVRTC_PATH = "nvrtc"
HOST_PATH = "host-oracle"


@dataclass(frozen=True)
class LaunchRecord:
    """One kernel launch (path "nvrtc") or one host-oracle stage (path "host-oracle")."""

    path: str
    stages: tuple[str, ...]
    module: str = ""
    entry: str = ""
    source_sha256: str = ""
    grid: tuple[int, int, int] = (0, 0, 0)
    block: tuple[int, int, int] = (0, 0, 0)
    scratch: dict = field(default_factory=dict)
    case: str = ""
    step: int = -1

    def to_dict(self) -> dict:
        record = asdict(self)
        record["stages"] = list(self.stages)
        record["grid"] = list(self.grid)
        record["block"] = list(self.block)
        return record


@dataclass
class DeviceInfo:
    """The machine and toolchain the launches ran on."""

    name: str = ""
    compute_capability: str = ""
    cuda_runtime: int = 0
    cuda_driver: int = 0
    nvrtc: str = ""
    cupy: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ModuleBuild:
    """One compiled module: the options NVRTC was given, what its PTX holds, the block it declares."""

    module: str
    source_sha256: str
    options: tuple[str, ...]
    ptx: PtxReport | None  # None where no PTX was made (the host emulation)
    block: int | None = None  # threads per block the module declares (csa_block_<entry>); None: the seed's

    def to_dict(self) -> dict:
        return {"source_sha256": self.source_sha256, "options": list(self.options),
                "ptx": None if self.ptx is None else self.ptx.to_dict(), "declared_block": self.block}


@dataclass
class RunProvenance:
    device: DeviceInfo | None
    kernels: dict
    launches: list[LaunchRecord] = field(default_factory=list)
    modules: dict[str, ModuleBuild] = field(default_factory=dict)
    compiled: dict[str, ModuleBuild] = field(default_factory=dict)  # the backend's builds, by module
    replay: dict | None = None  # --replay: {"mode": "graph", "captures", "replayed_steps"}

    def record(self, launch: LaunchRecord) -> None:
        """Keeps the launch and, once per run, the build of the module it launched."""
        self.launches.append(launch)
        if launch.path == NVRTC_PATH and launch.module not in self.modules:
            self.modules[launch.module] = self.compiled[launch.module]

    def for_case(self, case: str) -> list[LaunchRecord]:
        return [launch for launch in self.launches if launch.case == case]

    def to_dict(self) -> dict:
        return {
            "device": None if self.device is None else self.device.to_dict(),
            "kernels": self.kernels,
            "modules": {name: build.to_dict() for name, build in sorted(self.modules.items())},
            "launches": [launch.to_dict() for launch in self.launches],
            **({"replay": self.replay} if self.replay is not None else {}),
        }
