"""Explain-test fixtures: the device tests' host emulation, and a golden file whose cases show
every numerics variant (subnormals for flush-to-zero, both ratios, multi-step streams)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "device"))

from device_fixtures import ci_goldens_of, emulated_cuda, emulation_backend  # noqa: E402

__all__ = ["emulated_cuda", "emulation_backend", "variant_goldens"]

VARIANT_CASE_PATTERNS = (
    "quant-edge.r4-crafted-records",
    "quant-edge.r128-fp8-crafted-record",
    "boundaries.r128-resumed-119-*",
    "boundaries.r4-prefill-7",
    "random.r4-5out*",
)


@pytest.fixture(scope="session")
def variant_goldens(tmp_path_factory):
    return ci_goldens_of(VARIANT_CASE_PATTERNS, tmp_path_factory.mktemp("goldens") / "variants.h5")
