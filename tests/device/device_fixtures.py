"""Fixtures shared by the device and mutant tests: a small golden file made by the oracle, and
the host-emulation backend standing in for CUDA (the runner and CLI run without a GPU)."""

from __future__ import annotations

import fnmatch

import pytest

from csa_conform.device.host import GXX, HostEmulationBackend
from csa_conform.golden import write_goldens
from csa_conform.golden.recipes import suite_recipes
from csa_conform.oracle import run_step

# Both ratios, f32 and FP8 caches, multi-step streams with batch 2, a bias that masks whole
# rows, a 5-output node, a step the oracle rejects (the first case matching each pattern) and
# a decode step a replayed graph can serve (same extents as the step before it), negative index dots,
# a block end inside a B > 1 ratio-128 step, index scores apart in the last radix digit only.
DEVICE_CASE_PATTERNS = (
    "boundaries.r128-*",
    "boundaries.r128-resumed-247-*",
    "boundaries.r4-bias*",
    "boundaries.r4-chunks-*",
    "boundaries.r4-prefill-5",
    "edges.r128-*-block-end-in-step*",
    "edges.r4-*-far-gates",
    "edges.r4-near-tie-b2n2*",
    "errors.topk*",
    "random.r128-bias*",
    "random.r128-f32*",
    "random.r4-5out*",
    "random.r4-*-signed",
    "seed-closed-form.r4-stream*",
)


def pick(case_ids, pattern: str) -> str:
    """The first case id matching a pattern (fixture names evolve; the coverage they give must not)."""
    matches = sorted(case for case in case_ids if fnmatch.fnmatchcase(case, pattern))
    if not matches:
        raise AssertionError(f"no ci case matches {pattern!r}")
    return matches[0]


def ci_goldens_of(patterns, path):
    """A golden file, written by the oracle, of the first ci case matching each pattern."""
    recipes = {recipe.case_id: recipe for recipe in suite_recipes("ci")}
    chosen = sorted({pick(recipes, pattern) for pattern in patterns})
    write_goldens(path, (recipes[case].generate(run_step) for case in chosen))
    return path


@pytest.fixture(scope="session")
def device_goldens(tmp_path_factory):
    return ci_goldens_of(DEVICE_CASE_PATTERNS, tmp_path_factory.mktemp("goldens") / "device.h5")


@pytest.fixture(scope="session")
def emulation_backend(host_builds):
    if GXX is None:
        pytest.skip("g++ is not installed (needed to emulate the kernels on the host)")
    return HostEmulationBackend(host_builds)


@pytest.fixture
def emulated_cuda(monkeypatch, emulation_backend):
    """Every DeviceRunner created during the test launches on the host emulation."""
    import csa_conform.device.cuda as cuda

    monkeypatch.setattr(cuda, "CudaBackend", lambda: emulation_backend)
    return emulation_backend


@pytest.fixture(scope="session")
def cuda_device():
    """The CUDA device's description; skips (reason printed with -ra) when there is none."""
    from csa_conform.device.cuda import CudaBackend
    from csa_conform.errors import DeviceUnavailable

    try:
        return CudaBackend().info()
    except DeviceUnavailable as error:
        pytest.skip(f"no CUDA device: {error}")
