"""`csa-conform bench` on a CUDA device (skipped without one): CUDA-event timings with clocks, a step graph,
measured peaks, and a kernel that writes only once refused on the device too."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from csa_conform.cli import main
from csa_conform.errors import DeviceUnavailable
from csa_conform.exitcodes import ExitCode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_variants import skip_write  # noqa: E402

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
CASE = "random.r4-5out-i4-k3"


@pytest.fixture(scope="module", autouse=True)
def cuda_device():
    from csa_conform.device.cuda import CudaBackend

    try:
        return CudaBackend().info()
    except DeviceUnavailable as error:
        pytest.skip(f"no CUDA device: {error}")


def _bench(*args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(main, ["bench", "--case", CASE, "--time-cap", "0.5", "--json", *args])
    return result.exit_code, json.loads(result.stdout)


def test_the_builtin_kernels_are_timed_with_cuda_events_and_clocks():
    code, document = _bench()
    assert code == ExitCode.OK
    section = document["bench"]
    assert section["timer"] == "cuda-events" and section["caveat"] is None
    assert section["peaks"]["measured"]["bandwidth_bytes_per_s"] > 1e11
    (case,) = section["cases"]
    assert [row["status"] for row in case["rows"]] == ["timed"] * 6
    assert case["step_vs_sum"] is not None


def test_a_kernel_that_writes_only_once_is_refused_on_the_device(tmp_path):
    code, document = _bench("--kernels", str(skip_write(KERNELS, tmp_path / "lazy")))
    assert code == ExitCode.DIVERGED
    rows = {row["row"]: row for row in document["bench"]["cases"][0]["rows"]}
    assert rows["csa_ratio4_index_replicate"]["status"] == "refused"


def test_devices_all_benchmarks_the_cases_on_every_gpu(cuda_device):
    import cupy

    code, document = _bench("--devices", "all", "--mode", "step")
    assert code == ExitCode.OK
    runs = document["bench"]["devices"]["runs"]
    assert [run["device"] for run in runs] == list(range(cupy.cuda.runtime.getDeviceCount()))
    for run in runs:
        assert run["timer"] == "cuda-events" and run["name"] == cuda_device.name
        assert [row["status"] for row in run["cases"][0]["rows"]] == ["timed"]


def test_hot_rows_rotate_their_inputs_and_cold_samples_reset_the_persisting_l2():
    code, document = _bench("--mode", "hot")
    assert code == ExitCode.OK
    rows = document["bench"]["cases"][0]["rows"]
    assert [row["status"] for row in rows] == ["timed"] * 6
    assert all(row["rotation"]["copies"] > 1 and row["rotation"]["input_bytes"] > 0 for row in rows)
    code, cold = _bench()
    assert code == ExitCode.OK
    assert cold["bench"]["persisting_l2"].startswith("reset before every cold sample"), cold["bench"]["persisting_l2"]
    assert all("rotation" not in row for row in cold["bench"]["cases"][0]["rows"])
