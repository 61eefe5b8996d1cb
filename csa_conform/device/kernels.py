"""A kernel directory (specs/kernel-abi.md): the prelude plus one CUDA C file per module.

The entry names are the CUDA seed's ABI, so a production kernel directory
drops in with ``--kernels DIR``. A module's compiled source is the prelude,
a newline and the module file; its sha256 names it in the module cache and in
every launch record. NVRTC gets the options that make CUDA arithmetic the
reference's: IEEE division and square root, no flush-to-zero and, above all,
no contraction of a*b+c into an fma.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from csa_conform.errors import DeviceUnavailable
from csa_conform.resources import builtin_kernels
from csa_conform.stages import kernel_modules

PRELUDE = "block_quant.cuh"

# module file stem -> extern "C" entry (the registry's launches)
MODULES = kernel_modules()

NVRTC_OPTIONS = ("--fmad=false", "--prec-div=true", "--prec-sqrt=true", "--ftz=false")

# nvcc spells them the same; both default to C++17, which the prelude's hex float literals need.
NVCC_OPTIONS = NVRTC_OPTIONS


def builtin_directory() -> Path:
    """The project's own kernels/, packaged in a wheel or at the root of a checkout."""
    return builtin_kernels()


@dataclass(frozen=True)
class ModuleSource:
    """One module as NVRTC compiles it."""

    module: str
    entry: str
    path: Path
    source: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.source.encode("utf-8")).hexdigest()

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

    def __init__(self, path: str | Path | None = None):
        self.builtin = path is None
        self.path = builtin_directory() if path is None else Path(path)
        if not self.path.is_dir():
            raise DeviceUnavailable(f"kernel directory {self.path} does not exist")

    def _read(self, name: str) -> str:
        file = self.path / name
        if not file.is_file():
            raise DeviceUnavailable(
                f"kernel directory {self.path} has no {name} (a kernel directory holds {PRELUDE} and "
                f"{', '.join(stem + '.cu' for stem in MODULES)})"
            )
        return file.read_text(encoding="utf-8")

    def module(self, module: str) -> ModuleSource:
        if module not in MODULES:
            raise KeyError(module)
        source = self._read(PRELUDE) + "\n" + self._read(module + ".cu")
        return ModuleSource(module, MODULES[module], self.path / (module + ".cu"), source)

    def fingerprint(self) -> dict:
        """sha256 of every file present, for the run's provenance."""
        files = {}
        for name in (PRELUDE, *(stem + ".cu" for stem in MODULES)):
            file = self.path / name
            if file.is_file():
                files[name] = hashlib.sha256(file.read_bytes()).hexdigest()
        return {"path": str(self.path), "builtin": self.builtin, "files": files}
