"""On a CUDA device (pytest -m cuda; skipped with the reason when there is none): the device
libm against the NumPy oracle, the ci suite clean in every mode, determinism, compile errors."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from click.testing import CliRunner

from csa_conform.check.conformance import replay
from csa_conform.check.results import schema
from csa_conform.cli.diff import diff
from csa_conform.device import DeviceRunner, KernelDirectory
from csa_conform.device.cuda import CudaBackend
from csa_conform.device.kernels import PRELUDE, ModuleSource
from csa_conform.exitcodes import ExitCode
from csa_conform.golden import GoldenFile
from csa_conform.numerics import libm

pytestmark = pytest.mark.cuda

ROOT = Path(__file__).resolve().parents[2]
CI_GOLDENS = ROOT / "goldens" / "ci.h5"
SELFTEST = Path(__file__).resolve().parent / "libm_selftest.cu"


@pytest.fixture(scope="module")
def ci_goldens():
    if not CI_GOLDENS.exists():
        pytest.fail(f"{CI_GOLDENS} is missing (csa-conform generate --suite ci -o goldens/ci.h5)")
    return CI_GOLDENS


def _arguments(count: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(90)
    quarter = count // 4
    exponents = -(2 * rng.integers(0, 32, quarter)).astype(np.float32) / np.float32(64)
    angles = rng.integers(0, 1 << 20, quarter).astype(np.float32) * libm.powf(np.float32(160000), exponents)
    softmax = -rng.exponential(6.0, quarter).astype(np.float32)
    scales = np.abs(rng.standard_normal(quarter) * 10.0 ** rng.integers(-30, 30, quarter)).astype(np.float32)
    raw = rng.integers(0, 2**32, count - 3 * quarter, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([angles.astype(np.float32), softmax, scales / np.float32(448), raw])
    y = np.concatenate([exponents, rng.uniform(-30, 30, count - quarter).astype(np.float32)])
    return x, y


def test_device_libm_matches_the_numpy_oracle(cuda_device):
    """The prelude compiled exactly as the runner compiles modules, one thread per argument."""
    import cupy

    backend = CudaBackend()
    source = (KernelDirectory().path / PRELUDE).read_text() + "\n" + SELFTEST.read_text()
    kernel = backend.function(ModuleSource("libm_selftest", "csa_libm_selftest", SELFTEST, source))
    x, y = _arguments(4_000_000)
    device_x, device_y = cupy.asarray(x), cupy.asarray(y)
    outputs = [cupy.empty_like(device_x) for _ in range(5)]
    block = 256
    grid = ((x.size + block - 1) // block, 1, 1)
    backend.launch("csa_libm_selftest", kernel, grid, (block, 1, 1), (device_x, device_y, *outputs, np.int64(x.size)))
    with np.errstate(all="ignore"):
        expected = {
            "expf": libm.expf(x), "sinf": libm.sinf(x), "cosf": libm.cosf(x), "log2f": libm.log2f(x),
            "powf": libm.powf(np.abs(x), y),
        }
    for (name, oracle), output in zip(expected.items(), outputs):
        actual = cupy.asnumpy(output)
        same = (actual.view(np.uint32) == oracle.view(np.uint32)) | (np.isnan(actual) & np.isnan(oracle))
        assert same.all(), f"{name}: {np.count_nonzero(~same)} of {x.size} differ, first x={x[~same][0]!r}"


@pytest.mark.parametrize("args", [["--mode", "chained"], ["--mode", "isolated"], ["--force-host", "all"]],
                         ids=["chained", "isolated", "force-host-all"])
def test_ci_suite_diffs_clean(cuda_device, ci_goldens, args):
    result = CliRunner().invoke(diff, [str(ci_goldens), *args, "--json"])
    document = json.loads(result.stdout)
    jsonschema.validate(document, schema())
    artifacts = os.environ.get("CSA_CONFORM_ARTIFACTS")
    if artifacts:
        Path(artifacts, f"diff-{'-'.join(arg.strip('-') for arg in args)}.json").write_text(result.stdout)
    failing = [case["case"] for case in document["cases"] if not case["passed"]]
    assert result.exit_code == ExitCode.OK, f"{document['summary']}; diverged: {failing}"
    assert document["control_run"] is ("all" in args)
    if "all" not in args:
        kernels = document["kernels"]
        assert kernels["device"]["name"]
        assert {launch["path"] for launch in kernels["launches"]} == {"nvrtc"}
        assert kernels["kernels"]["build"]["profile"] == "strict"
        for module in kernels["modules"].values():
            assert "--ftz=false" in module["options"] and "-ftz=true" not in module["options"]
            assert not any(module["ptx"]["own_lines"].values()), module["ptx"]


def test_device_runs_are_deterministic(cuda_device, ci_goldens):
    with GoldenFile(ci_goldens) as golden:
        cases = [case for case in golden.case_ids() if not case.startswith("errors.")][:12]
        runs = []
        for _ in range(2):
            runner = DeviceRunner()
            runs.append([
                {(stage, name): array.tobytes() for stage, payload in outcome.actual.stages.items()
                 for name, array in payload.items()}
                for case in cases for outcome in replay(golden, case, runner) if outcome.actual is not None
            ])
    assert runs[0] == runs[1]


def test_a_kernel_that_does_not_compile_is_an_environment_failure(cuda_device, ci_goldens, tmp_path):
    kernels = Path(shutil.copytree(KernelDirectory().path, tmp_path / "kernels"))
    module = kernels / "csa_ratio4_attention.cu"
    module.write_text(module.read_text() + "\nthis is not CUDA;\n")
    result = CliRunner().invoke(diff, [str(ci_goldens), "--kernels", str(kernels), "--case", "boundaries.r4-*"])
    assert result.exit_code == ExitCode.ENVIRONMENT, result.output
    assert "NVRTC cannot compile" in result.output
    result = CliRunner().invoke(diff, [str(ci_goldens), "--kernels", str(kernels), "--case", "boundaries.r4-*",
                                       "--git-bisect"])
    assert result.exit_code == ExitCode.BISECT_SKIP
