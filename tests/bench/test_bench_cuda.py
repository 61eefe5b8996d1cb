"""`csa-conform bench` on a CUDA device (skipped without one): CUDA-event and CUPTI timings with clocks, a step
graph, measured peaks, and a kernel that writes only once refused on the device too."""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
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
    code, document = _bench("--timer", "events")
    assert code == ExitCode.OK
    section = document["bench"]
    assert section["timer"] == "cuda-events" and section["caveat"] is None and section["timer_fallback"] is None
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

    code, document = _bench("--devices", "all", "--mode", "step", "--timer", "events")
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


SPIN_NS = 20_000
SPIN = r"""
extern "C" __global__ void csa_test_spin(unsigned long long ns)
{
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < ns);
}
"""
ISSUE_DELAY_S = 0.05  # the hold kernel spins at least this long: counted, it would dwarf the launches


class _Unguarded:
    """The timers' guard for launches that own no buffers."""

    def poison(self) -> None:
        """Nothing to poison."""


@pytest.fixture(scope="module")
def cupti_timer():
    from csa_conform.bench.timers import AUTO, cupti_activity, timer_for
    from csa_conform.device.cuda import CudaBackend

    activity, reason = cupti_activity(AUTO)
    if activity is None and reason.startswith("CUPTI not found"):
        pytest.skip(reason)
    assert activity is not None, f"libcupti loads but does not start: {reason}"
    backend = CudaBackend()
    return backend, timer_for(backend, "cupti")


def _medians(timer, issue, count: int = 7) -> float:
    return statistics.median(timer.sample(issue, _Unguarded(), cold=True).seconds for _ in range(count))


def _slowly(issue):
    def issued() -> None:
        time.sleep(ISSUE_DELAY_S)  # the stream is held meanwhile
        issue()
    return issued


@pytest.mark.parametrize("as_graph", [False, True], ids=["launches", "graph"])
def test_cupti_times_the_launches_behind_the_hold_not_the_hold(cupti_timer, as_graph):
    from csa_conform.bench.timers import CudaTimer
    from csa_conform.device.kernels import Build, ModuleSource

    backend, cupti = cupti_timer
    events = CudaTimer(backend)
    spin = backend.function(ModuleSource("csa_test_spin", "csa_test_spin", Path("csa_test_spin.cu"), SPIN,
                                         Build("production", (), "the CUPTI timer's test")))
    backend.builds.pop("csa_test_spin", None)
    launches = [SimpleNamespace(function=spin, grid=(1, 1, 1), block=(32, 1, 1), args=(np.uint64(SPIN_NS),))] * 3
    try:
        cupti_s = _medians(cupti, _slowly((cupti.graph if as_graph else cupti.issue)(launches)))
        events_s = _medians(events, _slowly((events.graph if as_graph else events.issue)(launches)))
    finally:
        events.close()
    assert cupti.name == "cupti" and cupti.fallback is None
    kernels_s = 3 * SPIN_NS / 1e9
    assert cupti_s >= kernels_s, f"CUPTI {cupti_s * 1e6:.1f} us for three kernels of {SPIN_NS / 1e3} us each"
    assert cupti_s < kernels_s + ISSUE_DELAY_S / 2, (
        f"CUPTI {cupti_s * 1e6:.1f} us: the hold kernel (at least {ISSUE_DELAY_S * 1e6:.0f} us) was counted")
    assert cupti_s <= events_s * 1.02 + 2e-6, (
        f"CUPTI {cupti_s * 1e6:.2f} us, more than the events around the same launches ({events_s * 1e6:.2f} us)")
    assert events_s - cupti_s < 50e-6, f"CUPTI {cupti_s * 1e6:.2f} us against events {events_s * 1e6:.2f} us"


def test_cupti_and_events_time_the_builtin_kernels_alike(cupti_timer):
    code, cupti = _bench("--timer", "cupti")
    assert code == ExitCode.OK
    code, auto = _bench()
    assert code == ExitCode.OK and auto["bench"]["timer"] == "cupti" and auto["bench"]["timer_fallback"] is None
    code, events = _bench("--timer", "events")
    assert code == ExitCode.OK
    assert cupti["bench"]["timer"] == "cupti" and cupti["bench"]["timer_fallback"] is None
    cupti_rows, events_rows = (document["bench"]["cases"][0]["rows"] for document in (cupti, events))
    assert [row["status"] for row in cupti_rows] == ["timed"] * 6
    for mine, theirs in zip(cupti_rows, events_rows):
        assert mine["row"] == theirs["row"]
        own, other = mine["median_s"], theirs["median_s"]
        assert 0 < mine["p10_s"] <= own, mine
        # Events add the first launch's start latency, a few us; a median far from theirs is a wrong record set.
        assert own <= other * 1.1 + 2e-6 and own >= other / 2 - 5e-6, (
            f"{mine['row']}: CUPTI median {own * 1e6:.2f} us, events {other * 1e6:.2f} us")


def test_a_baseline_timed_with_events_is_gated_with_events(tmp_path, cupti_timer):
    samples = tmp_path / "samples.json"
    code, base = _bench("--timer", "events", "--mode", "step", "--samples", str(samples))
    assert code == ExitCode.OK
    (tmp_path / "base.json").write_text(json.dumps(base))
    code, document = _bench("--mode", "step", "--baseline", str(tmp_path / "base.json"))
    assert code in (ExitCode.OK, ExitCode.SLOW)
    assert document["bench"]["timer"] == "cuda-events"
    assert document["bench"]["cases"][0]["rows"][0]["gate"] is not None
    result = CliRunner().invoke(main, ["bench", "--case", CASE, "--timer", "cupti", "--baseline",
                                       str(tmp_path / "base.json")])
    assert result.exit_code == ExitCode.USAGE and "would gate one timer against another" in result.output
