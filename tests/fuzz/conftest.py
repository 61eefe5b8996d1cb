"""Fuzz-test fixtures: the device tests' host emulation (tests/device) and the planted bugs."""

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "device"))
sys.path.insert(0, str(TESTS / "kernels_mutants"))

from device_fixtures import emulated_cuda, emulation_backend  # noqa: E402

__all__ = ["emulated_cuda", "emulation_backend"]
