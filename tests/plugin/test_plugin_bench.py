"""``--csa-bench-baseline``: a bench item per case that fails the session when a row is SLOW against an
earlier ``bench --json --samples`` run, under the g++ host emulation (the gate's logic, no GPU)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from csa_conform.cli import main
from csa_conform.exitcodes import ExitCode
from plugin_fixtures import GOLDEN_NAME, R4_ID
from test_plugin_outcomes import outcomes

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from bench_variants import spun  # noqa: E402

pytest_plugins = ("pytester",)
pytestmark = pytest.mark.slow

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
BENCH_ID = f"{GOLDEN_NAME}::{R4_ID}::bench"


def bench_document(goldens: Path, kernels: Path, folder: Path, *extra: str) -> Path:
    """A host bench run of R4_ID on ``kernels`` written to ``folder``: the file bench items gate on."""
    result = CliRunner().invoke(main, ["bench", str(goldens), "--backend", "host", "--case", R4_ID, "--kernels",
                                       str(kernels), "--time-cap", "0.5", "--json", *extra])
    assert result.exit_code in (ExitCode.OK, ExitCode.SLOW), result.output  # host timings are noisy
    path = folder / "bench.json"
    path.write_text(result.stdout)
    return path


@pytest.fixture(scope="module")
def builtin_baseline(plugin_goldens, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("builtin-baseline")
    return bench_document(plugin_goldens, KERNELS, folder, "--samples", str(folder / "samples.json"))


@pytest.fixture(scope="module")
def slower_kernels(tmp_path_factory) -> Path:
    return spun(KERNELS, tmp_path_factory.mktemp("slower") / "kernels")


def test_a_slowed_kernel_fails_its_bench_item_and_the_session(inner, emulation_backend, builtin_baseline,
                                                              slower_kernels):
    inner.emulate_device(emulation_backend)
    result = inner.run(f"--csa-case={R4_ID}", f"--csa-kernels={slower_kernels}",
                       f"--csa-bench-baseline={builtin_baseline}")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    found = outcomes(result)
    outcome, text = found[BENCH_ID]
    assert outcome == "failed", text
    assert f"{R4_ID} csa_ratio4_index_replicate: SLOW against {builtin_baseline}" in text
    assert "recurred on the re-run" in text and f"reproduce: csa-conform bench {GOLDEN_NAME} --case" in text
    assert all(status == "passed" for node, (status, _) in found.items() if node != BENCH_ID)  # conformant
    result.stdout.fnmatch_lines([f"csa-conform: bench items gate on {builtin_baseline} (mode cold, "
                                 "time cap 0.5 s per row)"])


def test_kernels_faster_than_the_baseline_pass_their_bench_item(inner, emulation_backend, builtin_baseline,
                                                                tmp_path):
    """The baseline's samples made ten times slower (a slower machine's run): every row FAST, never fatal."""
    document = json.loads(builtin_baseline.read_text())
    kept = json.loads(Path(document["bench"]["samples_file"]).read_text())
    for row in kept["rows"]:
        row["times_s"] = [10 * seconds for seconds in row["times_s"]]
    (tmp_path / "samples.json").write_text(json.dumps(kept))
    document["bench"]["samples_file"] = str(tmp_path / "samples.json")
    (tmp_path / "slower.json").write_text(json.dumps(document))
    inner.emulate_device(emulation_backend)
    result = inner.run(f"--csa-case={R4_ID}", f"--csa-bench-baseline={tmp_path / 'slower.json'}")
    outcome, text = outcomes(result)[BENCH_ID]
    assert outcome == "passed", text
    assert result.ret == pytest.ExitCode.OK


def test_without_a_device_the_bench_item_is_skipped_with_the_reason(inner, monkeypatch, builtin_baseline):
    reason = inner.without_device(monkeypatch)
    result = inner.run(f"--csa-case={R4_ID}", f"--csa-bench-baseline={builtin_baseline}")
    assert outcomes(result)[BENCH_ID] == ("skipped", f"no device: {reason}")
    assert result.ret == pytest.ExitCode.OK


def test_a_bench_baseline_that_cannot_gate_is_one_usage_error(inner, plugin_goldens, tmp_path):
    unkept = bench_document(plugin_goldens, KERNELS, tmp_path)  # no --samples
    verify = tmp_path / "verify.json"
    verify.write_text(CliRunner().invoke(main, ["verify", str(plugin_goldens), "--case", R4_ID, "--json"]).stdout)
    for args, message in (
        ([f"--csa-bench-baseline={unkept}"], "ERROR: --csa-bench-baseline needs --csa-goldens FILE"),
        (["--csa-goldens", GOLDEN_NAME, "--csa-bench-baseline=missing.json"], "ERROR: --csa-bench-baseline: *"),
        (["--csa-goldens", GOLDEN_NAME, f"--csa-bench-baseline={verify}"],
         f"ERROR: --csa-bench-baseline: {verify}: not a bench results document*"),
        (["--csa-goldens", GOLDEN_NAME, f"--csa-bench-baseline={unkept}"],
         f"ERROR: --csa-bench-baseline: {unkept}: the run kept no samples*"),
    ):
        result = inner.plain(*args)
        assert result.ret == pytest.ExitCode.USAGE_ERROR, args
        result.stderr.fnmatch_lines([message])
        assert "Traceback" not in result.stderr.str()
