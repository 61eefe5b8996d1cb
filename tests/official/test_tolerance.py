"""calibrate writes an envelope per stage/tensor; diff --tolerance gives a dual verdict and gates within it."""

from __future__ import annotations

import json
import shutil
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


def test_diff_runs_in_the_mode_the_envelope_was_calibrated_in(golden, calibrated):
    document = json.loads(invoke("diff", str(golden), "--force-host", "all", "--tolerance", str(calibrated),
                                 "--json").stdout)
    assert document["options"]["mode"] == ISOLATED
    same = invoke("diff", str(golden), "--force-host", "all", "--tolerance", str(calibrated), "--mode", ISOLATED,
                  "--json")
    assert same.exit_code == ExitCode.OK and json.loads(same.stdout)["options"]["mode"] == ISOLATED
    assert json.loads(invoke("diff", str(golden), "--force-host", "all", "--json").stdout)["options"]["mode"] == \
        "chained"  # without --tolerance the default stays chained


def test_another_mode_than_the_envelopes_is_refused_in_one_line(golden, calibrated):
    result = invoke("diff", str(golden), "--force-host", "all", "--tolerance", str(calibrated), "--mode", "chained")
    assert result.exit_code == ExitCode.USAGE and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{calibrated} was calibrated isolated" in lines[0]
    assert "calibrate with --mode chained" in lines[0]


def test_a_tolerance_file_without_a_mode_is_refused(golden, tmp_path):
    path = tmp_path / "modeless.toml"
    path.write_text('[calibration]\nformat = "csa-conform-tolerances"\n["a/Y"]\nexact = true\n')
    result = invoke("diff", str(golden), "--force-host", "all", "--tolerance", str(path))
    assert result.exit_code == ExitCode.USAGE and "[calibration] mode must be one of chained, isolated" in result.stderr


def test_a_selection_that_moves_with_its_launchs_scores_is_bounded_by_its_sets(tmp_path):
    """The official scores reorder some top-k rows of this case (8 of its 22 rows). Selection shares its
    launch with scoring, so in either mode it reads its own launch's scores: the envelope bounds it by the
    share of differing rows and the worst set overlap. Candidate assembly is another launch: isolated, it
    reads the reference's selection and is exact; chained, it moves with the selection."""
    from csa_conform.golden import GoldenFile, write_goldens

    path = tmp_path / "chunks.h5"
    with GoldenFile(Path(__file__).resolve().parents[2] / "goldens" / "ci.h5") as golden:
        write_goldens(path, [golden.read_case("boundaries.r4-chunks-3-3-6-2")])
    limits = {}
    for mode in ("chained", ISOLATED):
        assert invoke("calibrate", str(path), "--mode", mode, "-o", str(tmp_path / f"{mode}.toml")).exit_code == 0
        limits[mode] = Tolerances.read(tmp_path / f"{mode}.toml").limits
    for mode in ("chained", ISOLATED):
        selection = limits[mode]["selection/selected_indices"]
        assert selection["exact"] is False
        assert 0 < selection["rows_differing"] <= 1 and 0 < selection["overlap_deficit"] <= 1
    assert limits[ISOLATED]["candidate_assembly/candidates"] == {"exact": True}
    assert limits["chained"]["candidate_assembly/candidates"]["exact"] is False


# --- the official-profile gate on the host backend: the reference passes, the control run passes, a bug fails

OFFICIAL_CASES = "*[el]-[8z]*"  # boundaries.r4-prefill-8 and seed-closed-form.r4-prefill-8, errors.topk-tie-zero-weights
ROOT = Path(__file__).resolve().parents[2]
MISSING_SINK = ("denominator = denominator + csa_expf(a.sink[r.head] - maximum);", "denominator = denominator + 0.0f;")


@pytest.fixture(scope="module")
def official(tmp_path_factory) -> tuple[Path, Path]:
    """Official goldens of three ratio-4 cases and their envelope (isolated, the default): the official
    scores of boundaries.r4-prefill-8 reorder its selection and tie, and the reference refuses the step of
    errors.topk-tie-zero-weights, whose ties the official profile orders."""
    folder = tmp_path_factory.mktemp("official-gate")
    goldens, envelope = folder / "official.h5", folder / "tolerances.toml"
    made = invoke("generate", "--suite", "ci", "--profile", "official", "--case", OFFICIAL_CASES, "-o", str(goldens),
                  "-q")
    assert made.exit_code == ExitCode.OK, made.output
    assert invoke("calibrate", str(goldens), "-o", str(envelope)).exit_code == ExitCode.OK
    return goldens, envelope


def gate(goldens: Path, envelope: Path, *args: str) -> tuple[int, dict]:
    result = invoke("diff", str(goldens), "--tolerance", str(envelope), "--json", *args)
    assert result.exit_code in (ExitCode.OK, ExitCode.DIVERGED), result.output
    return result.exit_code, json.loads(result.stdout)


def judged(document: dict) -> dict[str, dict]:
    return {f"{stage['stage']}/{stage['tensor']}": stage for stage in document["tolerance"]["stages"]}


def test_the_builtin_kernels_pass_the_envelope_calibrated_for_them(official):
    """The built-in kernels are the reference: their fused index launch selects from its own scores, which
    differ from the official goldens' in rows; the envelope, measured per launch, holds that."""
    code, document = gate(*official, "--backend", "host")
    selection = judged(document)["selection/selected"]
    assert not selection["bit_exact"] and selection["within"], selection["bounds"]
    assert document["tolerance"]["within"] and code == ExitCode.OK


def test_the_control_run_of_official_goldens_exits_0(official, tmp_path):
    """Every stage on the host oracle: selection reads the host's own scores, as the launch it stands in for
    would, and the one step the reference refuses (a tie the official profile orders) is not compared, as
    calibrate compares none; the gate is the envelope's, and it holds."""
    code, document = gate(*official, "--force-host", "all")
    assert document["control_run"] and document["tolerance"]["within"]
    assert [(entry["case"], entry["stage"]) for entry in document["tolerance"]["rejected_by_reference"]] == [
        ("errors.topk-tie-zero-weights", "selection")]
    assert code == ExitCode.OK
    plain = invoke("diff", *map(str, official[:1]), "--tolerance", str(official[1]), "--force-host", "all", "-q")
    assert plain.exit_code == ExitCode.OK
    assert "not compared: 1 step the reference refuses and the golden file's profile accepts" in plain.stdout
    results, html = tmp_path / "control.json", tmp_path / "control.html"
    results.write_text(json.dumps(document))
    assert invoke("report", str(results), "--html", str(html)).exit_code == ExitCode.OK
    assert "Not compared: 1 step the reference refuses" in html.read_text()


def test_a_kernel_with_a_planted_bug_fails_the_envelope(official, tmp_path):
    kernels = tmp_path / "kernels"
    shutil.copytree(ROOT / "kernels", kernels)
    source = kernels / "block_quant.cuh"
    text = source.read_text()
    assert text.count(MISSING_SINK[0]) == 1
    source.write_text(text.replace(*MISSING_SINK))
    code, document = gate(*official, "--backend", "host", "--kernels", str(kernels))
    y = judged(document)["sparse_sink_softmax_attention/Y"]
    assert not y["within"] and not document["tolerance"]["within"] and code == ExitCode.DIVERGED


def test_a_reference_files_refused_step_still_fails_the_gate():
    """A host stage that refuses a step its own reference goldens accept is the oracle disagreeing with
    itself: no envelope waives it."""
    from csa_conform.check.model import CaseVerdict, StepVerdict
    from csa_conform.cli.diff import reference_refusals

    stopped = CaseVerdict("tie", steps=[StepVerdict(0, False, problem="Unsupported: tie", stage="selection")])
    assert reference_refusals([stopped], "reference") == []
    assert reference_refusals([stopped], "official") == [
        {"case": "tie", "step": 0, "stage": "selection", "reason": "Unsupported: tie"}]
    validation = CaseVerdict("bad", steps=[StepVerdict(0, False, problem="rejects", stage="validation")])
    assert reference_refusals([validation], "official") == []
