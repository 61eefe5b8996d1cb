"""calibrate writes an envelope per stage/tensor; diff --tolerance gives a dual verdict and gates within it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from csa_conform.check.gap import measure_file
from csa_conform.cli import main
from csa_conform.compare.errorstats import ISOLATED, Gap, TensorErrors
from csa_conform.compare.tolerance import Tolerances
from csa_conform.exitcodes import ExitCode

CASES = "random.r128-bias-*"  # four ratio-128 steps with 129 candidates


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.fixture(scope="module")
def golden(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tolerance") / "small.h5"
    assert invoke("generate", "--case", CASES, "-o", str(path), "-q").exit_code == ExitCode.OK
    return path


@pytest.fixture(scope="module")
def calibrated(golden) -> Path:
    path = golden.parent / "tolerances.toml"
    result = invoke("calibrate", str(golden), "-o", str(path))
    assert result.exit_code == ExitCode.OK, result.output
    assert result.stdout.startswith(f"wrote {path}: ")
    return path


def test_the_envelope_is_exact_where_the_profiles_agree(calibrated):
    tolerances = Tolerances.read(calibrated)
    assert tolerances.calibration["mode"] == ISOLATED and tolerances.calibration["margin"] == 2.0
    assert tolerances.limits["compression_update/present_compressed_kv"] == {"exact": True}
    y = tolerances.limits["sparse_sink_softmax_attention/Y"]
    assert y["exact"] is False and y["neginf_mask_mismatches"] == 0
    assert 0 < y["abs.p99"] <= y["abs.max"]


def test_the_limits_are_the_margin_times_the_measured_statistics(golden, calibrated):
    gap = Gap(mode=ISOLATED)
    measure_file(gap, str(golden))
    y = next(errors for errors in gap.rows() if errors.tensor == "Y").entry()
    limits = Tolerances.read(calibrated).limits["sparse_sink_softmax_attention/Y"]
    assert limits["abs.max"] == 2 * y["abs"]["max"] and limits["abs.p99"] == 2 * y["abs"]["p99"]
    assert "rel.p99" not in limits
    assert limits["cosine_distance_max"] == 2 * y["cosine_distance_max"]


def test_the_control_run_is_bit_exact_and_within(golden, calibrated):
    result = invoke("diff", str(golden), "--force-host", "all", "--tolerance", str(calibrated), "--json")
    assert result.exit_code == ExitCode.OK, result.output
    document = json.loads(result.stdout)
    judged = document["tolerance"]
    assert judged["within"] and all(stage["bit_exact"] and stage["within"] for stage in judged["stages"])
    assert document["options"]["tolerance"] == str(calibrated)
    plain = invoke("diff", str(golden), "--force-host", "all", "--tolerance", str(calibrated), "-q")
    assert "sparse_sink_softmax_attention/Y" in plain.stdout and "envelope: within" in plain.stdout


def errors_of(expected: np.ndarray, actual: np.ndarray) -> TensorErrors:
    errors = TensorErrors("sparse_sink_softmax_attention", "Y")
    errors.add(expected, actual)
    return errors


def test_a_device_near_the_official_numerics_is_within_and_a_worse_one_is_not(golden, calibrated):
    """The official profile's own Y against the golden is inside; the same error tripled is outside."""
    from csa_conform.golden import GoldenFile
    from csa_conform.profiles.numerics import runner

    tolerances = Tolerances.read(calibrated)
    with GoldenFile(golden) as file:
        case = file.case_ids()[0]
        info, step = file.case_info(case), file.read_step(case, 0)
    official = runner("official")(info.attrs, step.inputs, list(info.output_names)).outputs["Y"]
    reference = step.outputs["Y"]
    near = tolerances.judge(errors_of(reference, official))
    assert near["within"] and not near["bit_exact"]
    worse = tolerances.judge(errors_of(reference, reference + 3 * (official - reference)))
    assert not worse["within"] and not worse["bit_exact"]
    assert {bound["statistic"] for bound in worse["bounds"] if not bound["within"]} >= {"abs.max"}


def test_an_unlisted_tensor_must_be_bit_exact():
    errors = errors_of(np.ones(3, np.float32), np.array([1, 1, 2], np.float32))
    verdict = Tolerances({}, {}).judge(errors)
    assert not verdict["within"] and verdict["bounds"][0]["statistic"] == "bit-exact"


@pytest.mark.parametrize("text, problem", [
    ("not toml [", "not a tolerance file"),
    ('[calibration]\nformat = "other"\n', "no [calibration] table"),
    ('[calibration]\nformat = "csa-conform-tolerances"\n["Y"]\nexact = false\n', "stage/tensor"),
    ('[calibration]\nformat = "csa-conform-tolerances"\n["a/Y"]\nexact = false\n"abs.max" = -1.0\n', ">= 0"),
])
def test_a_bad_tolerance_file_is_one_line_and_exit_2(golden, tmp_path, text, problem):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    result = invoke("diff", str(golden), "--force-host", "all", "--tolerance", str(path))
    assert result.exit_code == ExitCode.USAGE
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and problem in lines[0] and "Traceback" not in result.output


def test_calibrate_keeps_an_existing_file(calibrated):
    before = calibrated.read_text()
    result = invoke("calibrate", str(calibrated.parent / "small.h5"), "-o", str(calibrated))
    assert result.exit_code == ExitCode.USAGE and "--force" in result.stderr
    assert calibrated.read_text() == before
