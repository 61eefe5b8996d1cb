"""`csa-conform bench --backend host` end to end on one small ci case: timed rows that validate, a kernel
made slower that is SLOW (exit 3) against the unchanged one, a kernel that writes only once refused."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from xml.etree import ElementTree

import jsonschema
import pytest
from click.testing import CliRunner

import csa_conform.device.cuda as cuda
from csa_conform.cli import main
from csa_conform.device.host import GXX
from csa_conform.errors import DeviceUnavailable
from csa_conform.exitcodes import ExitCode
from csa_conform.check.results import schema

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_variants import skip_write, spun  # noqa: E402

pytestmark = [pytest.mark.skipif(GXX is None, reason="the host backend needs g++"), pytest.mark.slow]
KERNELS = Path(__file__).resolve().parents[2] / "kernels"
CASE = "random.r4-5out-i4-k3"  # one step, ratio 4: all five launches
LAUNCHES = ["csa_ratio4_main_compression", "csa_ratio4_index_compression", "csa_ratio4_index_select",
            "csa_ratio4_index_replicate", "csa_ratio4_attention"]
CAVEAT = "host timings: not a device measurement"


@pytest.fixture(autouse=True)
def no_cuda(monkeypatch):
    def refuse():
        raise DeviceUnavailable("CUDA was asked for under --backend host")

    monkeypatch.setattr(cuda, "CudaBackend", refuse)


def bench(*args: str, cap: str = "0.5"):
    return CliRunner().invoke(main, ["bench", "--backend", "host", "--case", CASE, "--time-cap", cap, *args])


def _rows(document: dict) -> dict[str, dict]:
    (case,) = document["bench"]["cases"]
    return {row["row"]: row for row in case["rows"]}


def test_the_builtin_kernels_are_timed_per_launch_and_step_labelled_as_host(tmp_path):
    samples = tmp_path / "samples.json"
    markdown = tmp_path / "bench.md"
    result = bench("--json", "--samples", str(samples), "--markdown", str(markdown))
    assert result.exit_code == ExitCode.OK, result.output
    document = json.loads(result.stdout)
    jsonschema.validate(document, schema())
    section = document["bench"]
    assert section["caveat"] == CAVEAT and section["timer"] == "host-perf-counter"
    rows = _rows(document)
    assert list(rows) == LAUNCHES + ["step"]
    for row in rows.values():
        assert row["status"] == "timed" and row["samples"] >= 1
        spent = row["repetitions"]  # the probe is the first of at most 3 warm-up repetitions (no clock here)
        assert spent == {"probe": 1, "warmup": row["warmup"], "samples": row["samples"] + row["throttled"]}, spent
        assert spent["warmup"] <= 2
        assert row["ci_s"][0] <= row["median_s"] <= row["ci_s"][1]
        assert row["roofline"]["bytes"] > 0 and row["roofline"]["measured"]["bound"] in ("memory", "compute")
        assert row["gate"] is None
    assert section["cases"][0]["step_vs_sum"] > 0
    kept = json.loads(samples.read_text())
    assert {(row["case"], row["row"]) for row in kept["rows"]} == {(CASE, name) for name in rows}
    assert CAVEAT in markdown.read_text()
    again = bench("--json", "--baseline", str(tmp_path / "base.json"))
    assert again.exit_code == ExitCode.USAGE  # no such file
    (tmp_path / "base.json").write_text(result.stdout)
    gated = bench("--json", "--baseline", str(tmp_path / "base.json"))
    assert gated.exit_code in (ExitCode.OK, ExitCode.SLOW), gated.output
    assert all(row["gate"]["verdict"] in ("SLOW", "FAST", "SAME", "AMBG") for row in _rows(json.loads(gated.stdout)).values())


def test_a_kernel_made_slower_is_slow_against_the_unchanged_one(tmp_path):
    slower = spun(KERNELS, tmp_path / "slower")
    result = bench("--kernels", str(slower), "--baseline-kernels", str(KERNELS), "--json", cap="1.0")
    document = json.loads(result.stdout)
    assert result.exit_code == ExitCode.SLOW, [row["gate"] for row in _rows(document).values()]
    jsonschema.validate(document, schema())
    replicate = _rows(document)["csa_ratio4_index_replicate"]
    assert replicate["gate"]["verdict"] == "SLOW" and replicate["gate"]["reruns"] == 1
    assert replicate["repetitions"]["probe"] == 2  # measured again: both measurements' repetitions counted
    assert replicate["repetitions"]["samples"] > replicate["samples"]
    assert replicate["gate"]["ratio"] > 2
    assert document["cases"][0]["failure"]["type"] == "slow"


def test_a_kernel_that_writes_only_once_is_refused_not_timed(tmp_path):
    lazy = skip_write(KERNELS, tmp_path / "lazy")
    result = bench("--kernels", str(lazy), "--json")
    assert result.exit_code == ExitCode.DIVERGED, result.output
    document = json.loads(result.stdout)
    rows = _rows(document)
    for name in ("csa_ratio4_index_replicate", "step"):
        assert rows[name]["status"] == "refused" and "median_s" not in rows[name]
        assert rows[name]["repetitions"]["probe"] == 1  # what a refused row spent is still counted
        assert "argument 1 (selected)" in rows[name]["message"]
    assert rows["csa_ratio4_index_select"]["status"] == "timed"
    assert document["cases"][0]["verdicts"]["selection"] == "identical"  # the conformance run itself passed
    results = tmp_path / "bench.json"
    results.write_text(result.stdout)
    junit = tmp_path / "junit.xml"
    assert CliRunner().invoke(main, ["report", str(results), "--junit", str(junit)]).exit_code == 0
    failure = ElementTree.parse(junit).getroot().find(".//failure")
    assert failure is not None and failure.get("type") == "timing-refused"


def test_devices_runs_every_case_once_per_worker_and_reports_each(tmp_path):
    """Two emulation workers (the pool and the merge; no GPU): a section per device, the top-level rows
    the first device's, every device's samples kept, and the outlier rule's note for two devices."""
    samples = tmp_path / "samples.json"
    markdown = tmp_path / "bench.md"
    result = bench("--devices", "1,0", "--json", "--samples", str(samples), "--markdown", str(markdown), cap="0.2")
    assert result.exit_code == ExitCode.OK, result.output
    document = json.loads(result.stdout)
    jsonschema.validate(document, schema())
    section = document["bench"]
    runs = section["devices"]["runs"]
    assert [run["device"] for run in runs] == document["options"]["devices"] == [1, 0]
    for run in runs:
        assert run["name"] == "host emulation (g++)" and run["timer"] == "host-perf-counter"
        assert [row["row"] for row in run["cases"][0]["rows"]] == LAUNCHES + ["step"]
        assert all(row["status"] == "timed" for row in run["cases"][0]["rows"])
    assert section["cases"] == runs[0]["cases"] and section["summary"] == runs[0]["summary"]
    assert section["devices"]["outliers"] == [] and "with 2, none is flagged" in section["devices"]["rule"]
    kept = json.loads(samples.read_text())
    assert [entry["device"] for entry in kept["devices"]] == [1, 0]
    assert [len(entry["rows"]) for entry in kept["devices"]] == [6, 6] and kept["rows"] == kept["devices"][0]["rows"]
    assert "outlier rule" in markdown.read_text()
    results, html = tmp_path / "bench.json", tmp_path / "bench.html"
    results.write_text(result.stdout)
    assert CliRunner().invoke(main, ["report", str(results), "--html", str(html)]).exit_code == 0
    page = html.read_text()
    assert all(f"<tr><td>{device}</td><td>host emulation (g++)</td>" in page for device in (0, 1))
    assert "the rows below are device 1's" in page
    printed = bench("--devices", "0,1", cap="0.2")
    assert printed.exit_code == ExitCode.OK, printed.output
    assert "device 0 (host emulation (g++)):" in printed.output and "device 1 (host emulation (g++)):" in printed.output


def test_devices_all_needs_gpus():
    result = bench("--devices", "all")
    assert result.exit_code == ExitCode.USAGE
    assert "--devices all counts GPUs: give ordinals (0,1,…) with --backend host" in result.output


def test_hot_samples_rotate_their_inputs_and_are_still_checked_bit_for_bit(tmp_path):
    result = bench("--mode", "hot", "--json", cap="0.2")
    assert result.exit_code == ExitCode.OK, result.output
    document = json.loads(result.stdout)
    jsonschema.validate(document, schema())
    rows = _rows(document)
    assert list(rows) == LAUNCHES + ["step"]
    for row in rows.values():
        assert row["status"] == "timed"
        # a few KiB of inputs: the cap of copies, which still fit the notional 16 MiB host cache
        assert row["rotation"] == {"copies": 64, "input_bytes": row["rotation"]["input_bytes"], "exceeds_cache": False}
        assert 0 < row["rotation"]["input_bytes"] < (16 << 20) // 64
    assert document["bench"]["persisting_l2"] is None  # the host has no persisting L2
    lazy = skip_write(KERNELS, tmp_path / "lazy")
    with (lazy / "csa_ratio4_index_replicate.cu").open("a") as source:
        source.write("// hot\n")  # a module of its own: a loaded module's ticket counter lives as long as the process
    lazy = bench("--mode", "hot", "--kernels", str(lazy), "--json", cap="0.2")
    assert lazy.exit_code == ExitCode.DIVERGED
    assert _rows(json.loads(lazy.stdout))["csa_ratio4_index_replicate"]["status"] == "refused"
    cold = _rows(json.loads(bench("--json", cap="0.2").stdout))
    assert all("rotation" not in row for row in cold.values())
