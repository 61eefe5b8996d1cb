"""`explain` on a GPU: every numerics variant of the project's kernels, and the production build,
is explained with all hypotheses available, the device's own libm included (skips without CUDA)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from csa_conform.device.kernels import KernelDirectory
from csa_conform.explain import EXPLAINED, INHERITED, explain_cases
from csa_conform.golden import GoldenFile

pytestmark = pytest.mark.cuda
CI_GOLDENS = Path(__file__).resolve().parents[2] / "goldens" / "ci.h5"
CASES = ("quant-edge.", "boundaries.r4-prefill-7", "boundaries.r128-resumed-119", "random.r4-5out",
         "seed-closed-form.r128-stream-to-257")


@pytest.fixture(scope="module")
def device():
    from csa_conform.device.cuda import CudaBackend
    from csa_conform.errors import DeviceUnavailable

    try:
        return CudaBackend()
    except DeviceUnavailable as error:
        pytest.skip(f"no CUDA device: {error}")


def _explanations(directory: KernelDirectory):
    with GoldenFile(CI_GOLDENS) as golden:
        cases = [case for case in golden.case_ids() if case.startswith(CASES)]
        return explain_cases(golden, cases, directory)


def test_the_probe_evaluates_cuda_libm_on_exact_points(device):
    build = KernelDirectory(build="production").build
    x = np.array([0.0, 1.0, 8.0, 0.25], dtype=np.float32)
    assert device.evaluate_libm("log2f", (x[1:],), build).tolist() == [0.0, 3.0, -2.0]
    assert device.evaluate_libm("expf", (np.zeros(3, np.float32),), build).tolist() == [1.0, 1.0, 1.0]
    assert device.evaluate_libm("powf", (np.float32(2), np.array([3.0, -1.0], np.float32)), build).tolist() == [
        8.0, 0.5]


@pytest.mark.parametrize("variant", [
    {"nvrtc_options": ("-DCSA_LIBM_PLATFORM",)},
    {"nvrtc_options": ("--ftz=true",)},
    {"nvrtc_options": ("-DCSA_BLOCK_SCALE_PLATFORM_LOG2F",)},
    {"build": "production", "nvrtc_options": ("-DCSA_CONTRACTIBLE",)},
], ids=["cuda-libm", "ftz", "block-scale-log2f", "production-contractible"])
def test_every_variant_divergence_is_explained_with_every_hypothesis(device, variant):
    explanations = _explanations(KernelDirectory(**variant))
    artifacts = os.environ.get("CSA_CONFORM_ARTIFACTS")
    if artifacts:
        name = "-".join(variant.get("nvrtc_options", ())) or variant.get("build", "")
        Path(artifacts, f"explain{name}.txt").write_text(
            "\n".join(line for e in explanations for line in e.lines()) + "\n")
    located = [e for e in explanations if e.verdict != INHERITED]
    for explanation in located:
        assert "device libm" not in explanation.skipped, explanation.skipped
        assert explanation.verdict == EXPLAINED, "\n".join(explanation.lines())
