"""A kernel directory (specs/kernel-abi.md): the prelude plus one CUDA C file per module, and how it builds.

The entry names are the CUDA seed's ABI, so a production kernel directory
drops in with ``--kernels DIR``. A module's compiled source is the prelude,
a newline and the module file; its sha256 names it in the module cache and in
every launch record.

How NVRTC compiles it is its build. ``strict`` makes CUDA arithmetic
the reference's: IEEE division and square root, no flush-to-zero and, above
all, no contraction of a*b+c into an fma. ``production`` is what the CUDA
execution provider does: NVRTC with no option but the device's virtual
architecture, so NVRTC's defaults apply (--fmad=true). A directory may say how
it builds in ``csa-kernels.toml`` (build, extra options, include paths,
other file names); the built-in kernels are judged strict, any other
directory by its manifest, else production.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import tomllib

from csa_conform._base.resources import builtin_kernels
from csa_conform.errors import DeviceUnavailable, UsageError
from csa_conform.spec import kernel_modules

PRELUDE = "block_quant.cuh"
MANIFEST = "csa-kernels.toml"

# module file stem -> extern "C" entry (the registry's launches)
MODULES = kernel_modules()

STRICT_OPTIONS = ("--fmad=false", "--prec-div=true", "--prec-sqrt=true", "--ftz=false")
BUILDS = {"strict": STRICT_OPTIONS, "production": ()}

# Line info changes no instruction; it lets the PTX report name the source line of each one.
LINE_INFO = "--generate-line-info"
# The most threads a CUDA block may have, so the most a module may declare for its entry.
MAX_BLOCK = 1024

# nvcc spells them the same; both default to C++17, which the prelude's hex float literals need.
NVCC_OPTIONS = STRICT_OPTIONS


def builtin_directory() -> Path:
    """The project's own kernels/, packaged in a wheel or at the root of a checkout."""
    return builtin_kernels()


@dataclass(frozen=True)
class Build:
    """How a directory's modules are compiled: the build (strict or production), options (without the arch),
    and where they came from."""

    name: str
    options: tuple[str, ...]
    origin: str
    include_paths: tuple[Path, ...] = ()
    strict_ptx: bool = False

    def nvrtc_options(self, architecture: str) -> tuple[str, ...]:
        """Everything NVRTC is given for a device of virtual architecture compute_XY."""
        includes = tuple(f"--include-path={path}" for path in self.include_paths)
        return self.options + includes + (f"--gpu-architecture={architecture}", LINE_INFO)

    def to_dict(self) -> dict:
        return {"profile": self.name, "options": list(self.options), "origin": self.origin,
                "include_paths": [str(path) for path in self.include_paths], "strict_ptx": self.strict_ptx}


@dataclass(frozen=True)
class Manifest:
    """A kernel directory's csa-kernels.toml."""

    build: str | None = None
    options: tuple[str, ...] = ()
    include_paths: tuple[Path, ...] = ()
    prelude: str = PRELUDE
    files: dict[str, str] = field(default_factory=dict)

    @classmethod
    def read(cls, directory: Path) -> Manifest | None:
        path = directory / MANIFEST
        if not path.is_file():
            return None
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
            raise UsageError(f"{path}: not valid TOML: {error}") from None
        known = {"build", "nvrtc-options", "include-paths", "prelude", "modules"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UsageError(f"{path}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
        build = data.get("build")
        if build is not None and build not in BUILDS:
            raise UsageError(f"{path}: build must be one of {', '.join(BUILDS)}, got {build!r}")
        options = _strings(path, data, "nvrtc-options")
        includes = tuple((directory / include).resolve() for include in _strings(path, data, "include-paths"))
        prelude = data.get("prelude", PRELUDE)
        modules = data.get("modules", {})
        if not isinstance(prelude, str) or not isinstance(modules, dict):
            raise UsageError(f"{path}: prelude must be a file name and [modules] a table of file names")
        for module, name in modules.items():
            if module not in MODULES or not isinstance(name, str):
                raise UsageError(f"{path}: [modules] maps the module names {', '.join(MODULES)} to file names; "
                                 f"got {module!r} = {name!r}")
        return cls(build, options, includes, prelude, dict(modules))


def _strings(path: Path, data: dict, key: str) -> tuple[str, ...]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise UsageError(f"{path}: {key} must be a list of strings")
    return tuple(value)


def resolve_build(manifest: Manifest | None, builtin: bool, name: str | None,
                  extra_options: tuple[str, ...] = (), strict_ptx: bool = False) -> Build:
    """--build wins, then the manifest's build, then strict (built-in) or production.

    The manifest's options and include paths always apply (they are how the
    directory builds); --nvrtc-option options come last, so they win in NVRTC.
    """
    if name is not None:
        origin = "--build"
    elif manifest is not None and manifest.build is not None:
        name, origin = manifest.build, MANIFEST
    elif builtin:
        name, origin = "strict", "default for the built-in kernels"
    else:
        name, origin = "production", "default for --kernels"
    manifest_options = manifest.options if manifest else ()
    includes = manifest.include_paths if manifest else ()
    return Build(name, BUILDS[name] + manifest_options + tuple(extra_options), origin, includes, strict_ptx)


@dataclass(frozen=True)
class ModuleSource:
    """One module as NVRTC compiles it."""

    module: str
    entry: str
    path: Path
    source: str
    build: Build = Build("strict", STRICT_OPTIONS, "default for the built-in kernels")
    prelude_path: Path | None = None
    prelude_lines: int = 0

    @cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.source.encode("utf-8")).hexdigest()

    def locate(self, line: int) -> str:
        """file:line in the directory of a line of the compiled source (prelude, newline, module)."""
        if line <= self.prelude_lines and self.prelude_path is not None:
            return f"{self.prelude_path.name}:{line}"
        return f"{self.path.name}:{line - self.prelude_lines}"

    @property
    def block_symbol(self) -> str:
        """The ``__constant__ int`` by which a module declares its entry's threads per block
        (specs/kernel-abi.md); without it the entry runs with the seed's launch shape."""
        return f"csa_block_{self.entry}"

    def declared_block(self, value: int | None) -> int | None:
        """The block the compiled module declares (None: undeclared), refused outside 1-1024 threads."""
        if value is not None and not 1 <= value <= MAX_BLOCK:
            raise DeviceUnavailable(f"{self.path}: {self.block_symbol} = {value} is not a block size "
                                    f"(1 to {MAX_BLOCK} threads)")
        return value

    @property
    def parameters(self) -> tuple[str, ...]:
        """The entry's parameter names in ABI order, so a finding names ``argument 7 (total_ptr)``;
        empty when the signature cannot be read (names are then left out, never guessed)."""
        found = re.search(r'extern\s+"C"\s+__global__\s+void\s+' + re.escape(self.entry) + r"\s*\(([^)]*)\)",
                          self.source)
        if found is None:
            return ()
        names = [re.findall(r"[A-Za-z_]\w*", parameter) for parameter in found.group(1).split(",")]
        return tuple(words[-1] if words else "" for words in names)


class KernelDirectory:
    """Reads a kernel directory lazily; a missing file is an environment error naming it."""

    def __init__(self, path: str | Path | None = None, *, build: str | None = None,
                 nvrtc_options: tuple[str, ...] = (), strict_ptx: bool = False):
        self.builtin = path is None
        self.path = builtin_directory() if path is None else Path(path)
        if not self.path.is_dir():
            raise DeviceUnavailable(f"kernel directory {self.path} does not exist")
        self.manifest = None if self.builtin else Manifest.read(self.path)
        self.build = resolve_build(self.manifest, self.builtin, build, tuple(nvrtc_options), strict_ptx)

    def probed(self, define: str) -> KernelDirectory:
        """The same directory built with ``define`` too (explain's probe build, csa_conform.device.probes):
        its modules are other sources to every cache, so the directory's own build is never replaced."""
        probed = copy.copy(self)
        probed.build = dataclasses.replace(self.build, options=self.build.options + (define,))
        return probed

    @property
    def prelude(self) -> str:
        return self.manifest.prelude if self.manifest else PRELUDE

    def file_name(self, module: str) -> str:
        if self.manifest and module in self.manifest.files:
            return self.manifest.files[module]
        return module + ".cu"

    def read(self, name: str) -> str:
        """One file of the directory as text (what a module's source is made of)."""
        return self._read(name)

    def _read(self, name: str) -> str:
        file = self.path / name
        if not file.is_file():
            raise DeviceUnavailable(
                f"kernel directory {self.path} has no {name} (a kernel directory holds {self.prelude} and "
                f"{', '.join(self.file_name(stem) for stem in MODULES)}; {MANIFEST} may rename them)"
            )
        return file.read_text(encoding="utf-8")

    def module(self, module: str) -> ModuleSource:
        if module not in MODULES:
            raise KeyError(module)
        prelude = self._read(self.prelude)
        source = prelude + "\n" + self._read(self.file_name(module))
        return ModuleSource(module, MODULES[module], self.path / self.file_name(module), source, self.build,
                            self.path / self.prelude, prelude.count("\n") + 1)

    def fingerprint(self) -> dict:
        """sha256 of every file present, and the build, for the run's provenance."""
        files = {}
        names = [self.prelude, *(self.file_name(stem) for stem in MODULES)]
        if self.manifest is not None:
            names.append(MANIFEST)
        for name in names:
            file = self.path / name
            if file.is_file():
                files[name] = hashlib.sha256(file.read_bytes()).hexdigest()
        return {"path": str(self.path), "builtin": self.builtin, "files": files, "build": self.build.to_dict()}
