"""Plugin-test fixtures (defined in plugin_fixtures; the device tests' host emulation and GPU probe)."""

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "device"))
sys.path.insert(0, str(TESTS / "kernels_mutants"))

from device_fixtures import cuda_device, emulation_backend  # noqa: E402
from plugin_fixtures import first_numba_compile, inner, plugin_goldens  # noqa: E402

first_numba_compile()

__all__ = ["cuda_device", "emulation_backend", "inner", "plugin_goldens"]
