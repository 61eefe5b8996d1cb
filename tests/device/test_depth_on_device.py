"""On a CUDA device (pytest -m cuda): the built-in kernels pass every mode of specs/device-depth.md
on the ci suite (the sanitizer tools on its boundary cases, to keep the run short), and the
work spread over GPUs or shards gives the single, unsharded document."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from csa_conform.check.results import schema
from csa_conform.cli.diff import diff
from csa_conform.cli.report import report_command
from csa_conform.device.sanitizer import TOOLS, find_sanitizer
from csa_conform.errors import DeviceUnavailable
from csa_conform.exitcodes import ExitCode

pytestmark = pytest.mark.cuda

CI_GOLDENS = Path(__file__).resolve().parents[2] / "goldens" / "ci.h5"


@pytest.fixture(scope="module")
def ci_goldens():
    if not CI_GOLDENS.exists():
        pytest.fail(f"{CI_GOLDENS} is missing (csa-conform generate --suite ci -o goldens/ci.h5)")
    return CI_GOLDENS


def _document(*args) -> tuple[int, dict]:
    result = CliRunner().invoke(diff, [str(arg) for arg in args] + ["--json"])
    document = json.loads(result.stdout)
    jsonschema.validate(document, schema())
    return result.exit_code, document


def _untimed(document: dict) -> dict:
    document = json.loads(json.dumps(document))
    document["summary"].pop("time_s")
    document.pop("argv")
    for case in document["cases"]:
        case.pop("time_s")
    return document


def test_the_builtin_kernels_are_deterministic_on_the_device(cuda_device, ci_goldens):
    code, document = _document(ci_goldens, "--repeat", "5")
    assert code == ExitCode.OK, [case["case"] for case in document["cases"] if not case["passed"]]


def test_the_builtin_kernels_replay_on_a_cuda_graph(cuda_device, ci_goldens):
    code, document = _document(ci_goldens, "--replay", "graph")
    assert code == ExitCode.OK, [case["case"] for case in document["cases"] if not case["passed"]]
    assert document["kernels"]["replay"]["replayed_steps"] >= 1


@pytest.mark.parametrize("tool", TOOLS)
def test_the_builtin_kernels_are_clean_under_compute_sanitizer(cuda_device, ci_goldens, tool):
    try:
        find_sanitizer()
    except DeviceUnavailable as error:
        pytest.skip(str(error))
    code, document = _document(ci_goldens, "--sanitize", tool, "--case", "boundaries.*")
    assert code == ExitCode.OK, document["sanitizer"]["findings"][:5]
    assert document["sanitizer"]["error_count"] == 0


def test_devices_all_is_one_devices_document(cuda_device, ci_goldens):
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("one CUDA device: --devices all has nothing to spread over")
    _, single = _document(ci_goldens)
    _, spread = _document(ci_goldens, "--devices", "all")
    assert _untimed(spread) == _untimed(single)


def test_merged_shards_are_the_unsharded_run_on_the_device(cuda_device, ci_goldens, tmp_path):
    _, whole = _document(ci_goldens)
    shards = []
    for index in (1, 2):
        _, shard = _document(ci_goldens, "--shard", f"{index}/2")
        shards.append(tmp_path / f"shard-{index}.json")
        shards[-1].write_text(json.dumps(shard))
    merged = tmp_path / "merged.json"
    result = CliRunner().invoke(report_command, [*map(str, shards), "--merged", str(merged)])
    assert result.exit_code == ExitCode.OK, result.output
    assert _untimed(json.loads(merged.read_text())) == _untimed(whole)
