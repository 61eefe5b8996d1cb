"""A diagnosis you can trust (issue 28): thin patterns are not claimed, permutations are checked where they
predict a change, layouts and aliased rows are named, rival hypotheses make a verdict ambiguous, a sub-step
is named only on positive evidence, and an explanation that fails is a failed verdict (the run's exit code stays
the diff's)."""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import pytest
from click.testing import CliRunner

import csa_conform.explain.entry as entry
from csa_conform.exitcodes import ExitCode
from csa_conform.explain import AMBIGUOUS, EXPLAINED, FAILED, UNEXPLAINED, Explanation, Trial
from csa_conform.explain.ablation import Variant
from csa_conform.explain.hypotheses import Hypothesis
from csa_conform.explain.patterns import Context, diagnose
from csa_conform.explain.claims import confidence_of
from csa_conform.explain.patterns.findings import MIN_SUPPORT
from csa_conform.explain.patterns.layout import written_as
from csa_conform.explain.stages import run_stage
from csa_conform.golden import GoldenFile
from csa_conform.numerics.variant import Numerics

from ci_steps import CI_GOLDENS, ROOT, add_rival, explain_payload, first_step

def _diagnosed(expected: np.ndarray, actual: np.ndarray, axes: tuple[str, ...]):
    return diagnose("stage", {"t": expected}, {"t": actual}, {"t": axes}, Context("stage"))


def test_the_confidence_word_follows_the_documented_rule():
    assert [confidence_of(n) for n in (0, 1, 2, 7, 8, 10_000)] == ["weak", "weak", "moderate", "moderate",
                                                                     "strong", "strong"]


def test_a_reversed_row_that_fits_only_the_slot_that_changed_is_no_permutation():
    """The ratio-128 causal count one too large: one more slot holds record 0, and the reversed reference
    row's last slot is 0 too; the 128 other slots the reversal would move are the reference's."""
    expected = np.concatenate([np.arange(128), [-1]]).astype(np.int32)[None, None].repeat(20, axis=1)
    actual = expected.copy()
    actual[..., 128] = 0
    found = _diagnosed(expected, actual, ("b", "s", "c"))
    assert all(finding.kind != "permutation" for finding in found), [f.headline for f in found]


def test_four_differing_elements_that_fit_a_reordering_are_not_claimed():
    rng = np.random.default_rng(1)
    expected = rng.permutation(64).astype(np.int32).reshape(2, 1, 32)
    actual = expected.copy()
    actual[1, 0, :4] = expected[1, 0, :4][::-1]
    assert np.count_nonzero(actual != expected) == 4 < MIN_SUPPORT
    found = _diagnosed(expected, actual, ("b", "s", "k"))
    # no transform is claimed; that the row holds the reference's values in another order is a fact, which order
    # unsaid (an observation)
    assert all(finding.kind not in ("permutation", "index-shift", "row-aliasing") or
               (finding.established_by == "observation" and finding.evidence["pattern"] == "reordered")
               for finding in found)
    assert any(finding.kind == "permutation" for finding in found)


def test_rows_that_hold_another_rows_data_are_aliased_and_axes_written_in_another_order_a_layout():
    rng = np.random.default_rng(2)
    expected = rng.standard_normal((3, 4, 16)).astype(np.float32)
    aliased = expected.copy()
    aliased[1:] = expected[0]
    finding = _diagnosed(expected, aliased, ("b", "s", "d"))[0]
    assert finding.kind == "row-aliasing" and finding.evidence["rows"] == {1: 0, 2: 0} and finding.decisive
    # which offset the kernel left out (if any) is no fact of the bytes: rows that compute the same thing alias too
    assert "every one holds b=0's data" in finding.headline and "left out" not in finding.headline
    assert finding.confidence == "strong"
    square = rng.standard_normal((2, 4, 4, 8)).astype(np.float32)
    finding = _diagnosed(square, written_as(square, (0, 2, 1, 3)), ("b", "s", "h", "d"))[0]
    assert finding.kind == "layout" and finding.evidence["written"] == "[b,h,s,d]"
    assert finding.evidence["contract"] == "[b,s,h,d]" and finding.decisive


def test_rival_ingredients_that_both_reproduce_make_the_verdict_ambiguous(monkeypatch):
    """bf16 ties away from zero reproduces the device; so does a rival of another ingredient that rounds the
    same way: neither is chosen, both are named."""
    g, inputs, expected = first_step("boundaries.r4-chunks-3-3-6-2")
    stage = "index_query_finalize"
    device = run_stage(stage, g, inputs, expected, Numerics(bf16_rounding="ties-away"))
    alone = explain_payload(stage, g, inputs, expected, device)
    assert alone.verdict == EXPLAINED and alone.cause.key == "bf16:ties-away"
    assert alone.diagnosis[0].kind == "rounding-convention" and alone.confidence in ("strong", "moderate", "weak")
    assert f"({alone.cause.strength()})" in alone.headline()
    rival = Hypothesis("rival:bf16-elsewhere", "a rival that rounds bf16 ties away too", bf16="ties-away")
    add_rival(monkeypatch, rival)
    both = explain_payload(stage, g, inputs, expected, device)
    assert both.verdict == AMBIGUOUS and both.cause is None and both.confidence == AMBIGUOUS
    assert {trial.key for trial in both.rivals} == {"bf16:ties-away", "rival:bf16-elsewhere"}
    assert ": ambiguous: " in both.headline() and " or " in both.headline()
    assert all(finding.kind != "rounding-convention" for finding in both.diagnosis)
    assert both.to_dict()["rivals"][0]["support"] >= 1


def test_records_pooled_from_another_vector_fit_every_norm_keeping_sub_step_and_unmatched_ones_nothing():
    """Pooled with other weights, a record is still RMS-normalized: consistent with another pooled vector, but
    as much with anything before the quantization that keeps the norm (an element read from elsewhere in
    RMSNorm, a rotation at another angle, a row streamed into the carry at another slot), so no sub-step is
    named. Scrambled bytes match nothing."""
    from csa_conform.explain.patterns.substeps import STREAMED, localize

    g, inputs, expected = first_step("boundaries.r4-prefill-8")
    stage = "compression_update"
    gate = np.asarray(inputs["compressor_gate"], dtype=np.float32)
    device = run_stage(stage, g, dict(inputs, compressor_gate=gate * np.float32(0.5)), expected)
    found = localize(stage, g, inputs, expected[stage], device)
    assert found is not None and found.evidence["rule"] == "normalized" and found.evidence["sub_step"] is None
    assert found.evidence["consistent"] == [STREAMED, "pool", "bf16", "RMSNorm", "RoPE", "FP8 block quantization"]
    # a fit within a bound says what it measured and how wide the bound was, so "RMS 1" is never a rounded claim
    measured = re.search(r"RMS is 1 within the quantization error \(measured (\d\.\d\d)(?:–(\d\.\d\d))?× the "
                         r"reference's, the bound ±(\d+)%\)", found.headline)
    assert measured, found.headline
    low, high, bound = float(measured[1]), float(measured[2] or measured[1]), int(measured[3]) / 100
    assert 1 - bound - 0.005 <= low <= high <= 1 + bound + 0.005
    scrambled = {key: np.array(value, copy=True) for key, value in expected[stage].items()}
    records = scrambled["present_compressed_kv"]
    records[:, -1] = np.random.default_rng(3).integers(0, 255, records[:, -1].shape, dtype=np.uint8)
    found = localize(stage, g, inputs, expected[stage], scrambled)
    assert found.evidence["sub_step"] is None and found.evidence["rule"] == "none"
    assert found.headline.startswith("no sub-step's output could be matched")


@pytest.mark.usefixtures("emulated_cuda")
def test_an_explanation_that_crashes_is_a_failed_verdict_and_the_diffs_exit_1_with_every_other_verdict_kept(
        monkeypatch, tmp_path):
    sys.path.insert(0, str(ROOT / "tests" / "kernels_mutants"))
    from diagnosis_mutants import DIAGNOSED

    from csa_conform.cli.explain import explain_command

    bug = next(bug for bug in DIAGNOSED if bug.name == "window_starts_one_early")
    kernels = bug.mutant.apply(ROOT / "kernels", tmp_path / "kernels")
    stock = entry.diagnose_stage

    def crashing(stage, *args):
        if stage == "candidate_assembly":
            raise IndexError("index 13 is out of bounds for axis 1 with size 13")
        return stock(stage, *args)

    monkeypatch.setattr(entry, "diagnose_stage", crashing)
    result = CliRunner().invoke(explain_command, [str(CI_GOLDENS), "--case", "boundaries.r128-resumed-247-to-257",
                                                  "--kernels", str(kernels), "--json"])
    assert result.exit_code == ExitCode.DIVERGED == 1, result.output
    document = json.loads(result.stdout)
    assert document["exit_code"] == 1 and document["explain"]["summary"]["failed"] >= 1
    verdicts = {(e["stage"], e["verdict"]) for e in document["explain"]["explanations"]}
    assert ("candidate_assembly", FAILED) in verdicts
    assert any(verdict != FAILED for _, verdict in verdicts), "the other verdicts are kept"
    failed = next(e for e in document["explain"]["explanations"] if e["verdict"] == FAILED)
    assert failed["divergence"] and "explanation failed: internal error in csa-conform: IndexError: index 13" in \
        failed["headline"] and failed["headline"].endswith("please report it")
    assert "internal error in csa-conform" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.usefixtures("emulated_cuda")
def test_a_detector_that_crashes_in_diff_explain_under_git_bisect_leaves_the_diffs_exit_1(monkeypatch, tmp_path):
    """The gate's diagnosis line and explain both run the detectors: one that raises costs the line and fails
    that explanation, never the verdict (a bisect must not skip the commit that introduced the bug)."""
    sys.path.insert(0, str(ROOT / "tests" / "kernels_mutants"))
    from diagnosis_mutants import DIAGNOSED

    import csa_conform.explain.patterns.shift as shift
    from csa_conform.cli.diff import diff

    bug = next(bug for bug in DIAGNOSED if bug.name == "window_starts_one_early")
    kernels = bug.mutant.apply(ROOT / "kernels", tmp_path / "kernels")

    def crashing(*args):
        raise ValueError("cannot reshape array of size 0 into shape (1,0,newaxis)")

    monkeypatch.setattr(shift, "index_shift", crashing)
    result = CliRunner().invoke(diff, [str(CI_GOLDENS), "--case", "boundaries.r128-resumed-247-to-257", "--kernels",
                                       str(kernels), "--explain", "--git-bisect", "--json"])
    assert result.exit_code == ExitCode.DIVERGED, result.output
    document = json.loads(result.stdout)
    failed = [e for e in document["explain"]["explanations"] if e["verdict"] == FAILED]
    assert failed and all("ValueError: cannot reshape" in e["headline"] for e in failed)
    assert "warning: explaining" in result.stderr and "Traceback" not in result.stderr


def test_an_unexpected_exception_in_any_command_is_exit_70_naming_the_tool(monkeypatch):
    import csa_conform.cli.inspect as inspect_module
    from csa_conform.cli import main

    def broken(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr(inspect_module, "GoldenFile", broken)
    result = CliRunner().invoke(main, ["inspect", str(CI_GOLDENS)])
    assert result.exit_code == ExitCode.INTERNAL
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("csa-conform: error: internal error in csa-conform: KeyError: 'a bug' at ")
    assert line.endswith("; please report it") and "Traceback" not in result.stderr


def _witness(case: str, stage: str, ratio: int):
    """A conformant chained report of ``case`` with ``stage`` computed on the device."""
    from csa_conform.check.model import CaseVerdict, StageVerdict

    with GoldenFile(CI_GOLDENS) as golden:
        steps = golden.step_count(case)
    report = CaseVerdict(case, ratio=ratio, step_count=steps)
    report.stages[stage] = StageVerdict(stage, "device", "identical")
    return report


def test_a_conformant_case_of_the_same_kernel_refutes_the_rival_it_contradicts(monkeypatch):
    """Both rivals reproduce the divergence; on a conformant case where bf16 ties occur the device kept the
    reference's bytes, which one rival (ties away everywhere) predicts otherwise: it is refuted, the other
    explains, and the experiment is reported."""
    g, inputs, expected = first_step("boundaries.r4-chunks-3-3-6-2")
    stage = "index_query_finalize"
    device = run_stage(stage, g, inputs, expected, Numerics(bf16_rounding="ties-away"))
    rival = Hypothesis("rival:reference-elsewhere", "a rival that predicts the reference's bytes elsewhere",
                       bf16="ties-away")
    add_rival(monkeypatch, rival)
    real = entry.Witnesses.run

    def run(self, stage, ratio, hypotheses):
        experiments = real(self, stage, ratio, hypotheses)
        for experiment in experiments:  # the rival is, by construction, right wherever the device conformed
            experiment["predicted_differing"]["rival:reference-elsewhere"] = 0
        return experiments

    monkeypatch.setattr(entry.Witnesses, "run", run)
    with GoldenFile(CI_GOLDENS) as golden:
        witnesses = entry.Witnesses(golden, [_witness("boundaries.r4-chunks-3-3-6-2", stage, g.ratio)])
        explanation = explain_payload(stage, g, inputs, expected, device, witnesses)
    assert explanation.experiments and explanation.experiments[0]["device_differing"] == 0
    assert explanation.experiments[0]["predicted_differing"]["bf16:ties-away"] > 0
    assert sorted(explanation.refuted) == ["bf16:ties-away"]
    assert explanation.verdict == EXPLAINED and explanation.cause.key == "rival:reference-elsewhere"
    # a step that resumes the stream is the first witness (a fresh prefill reads no past state)
    assert [experiment["step"] for experiment in explanation.experiments] == [1, 2]
    assert "bf16:ties-away refuted on boundaries.r4-chunks-3-3-6-2 step 1" in explanation.headline()
    assert explanation.to_dict()["refuted"] == ["bf16:ties-away"]


def _trial(key: str, mismatches: int, changed: int = 4) -> Trial:
    return Trial(key, key, mismatches, 100, {"expf": (changed, 20)} if mismatches == 0 else {})


def test_a_cause_on_few_arguments_is_claimed_only_where_another_step_reproduces_it_too():
    """Two fused pairs rounding another way reproduce one step: alone, that is no cause (an angle summed in
    another association moves two elements as well). The run's other divergent steps the same re-run reproduces
    (any kernel's), and the ablated steps where the divergence persists, add their evidence up to the 8 it needs."""
    kernel, stage = "compression.cu:entry", "compression_update"

    def alone(*others, experiments=()):
        explanation = Explanation("case", 0, stage, EXPLAINED, cause=_trial("fma:pairs", 0, changed=2),
                                  kernel=kernel, experiments=list(experiments))
        explanation.rivals = [explanation.cause]
        entry.settle_across_steps([explanation, *others])
        return explanation

    lone = alone()
    assert lone.verdict == UNEXPLAINED and lone.cause is None and lone.closest.key == "fma:pairs"
    assert ("fma:pairs reproduces this step bit for bit, but on 2 changed arguments, 2 with every other step it "
            "reproduces (fewer than 8), so it is not claimed as the cause") in lone.headline()
    again = Explanation("other", 3, stage, UNEXPLAINED, kernel=kernel, trials=[_trial("fma:pairs", 0, changed=5)])
    assert alone(again).verdict == UNEXPLAINED  # 7 arguments in all
    more = Explanation("more", 1, stage, UNEXPLAINED, kernel=kernel, trials=[_trial("fma:pairs", 0, changed=1)])
    assert alone(again, more).verdict == EXPLAINED
    elsewhere = Explanation("other", 3, "index_scoring", UNEXPLAINED, kernel="another.cu:entry",
                            trials=[_trial("fma:pairs", 0, changed=6)])
    assert alone(elsewhere).verdict == EXPLAINED  # one build: another kernel's step reproduced counts too
    missed = Explanation("other", 3, stage, UNEXPLAINED, kernel=kernel, trials=[_trial("fma:pairs", 4, changed=0)])
    assert alone(missed).verdict == UNEXPLAINED
    persisted = {"case": "case", "step": 0, "ablation": "one-row", "change": "only batch row b=0",
                 "predicted_differing": {}, "device_differing": 6, "unlike_device": {"fma:pairs": 0}}
    assert alone(experiments=[persisted]).verdict == EXPLAINED
    assert alone(experiments=[{**persisted, "device_differing": 5}]).verdict == UNEXPLAINED
    # another step's ablated variants count for this one as for their own (a stream's later step, never ablated)
    first = Explanation("case", 1, stage, UNEXPLAINED, kernel=kernel, trials=[_trial("fma:pairs", 0, changed=1)],
                        experiments=[{**persisted, "step": 1, "device_differing": 5}])
    confirmed = alone(first)
    assert confirmed.verdict == EXPLAINED
    assert ("with the 1 other divergent step of this run it reproduces bit for bit, 8 changed arguments or "
            "reproduced elements in all (a cause needs 8)") in confirmed.headline()
    # a case's own pass leaves it to the run's: another case may still reproduce it
    waiting = Explanation("case", 0, stage, EXPLAINED, cause=_trial("fma:pairs", 0, changed=2), kernel=kernel)
    waiting.rivals = [waiting.cause]
    entry.settle_across_steps([waiting], final=False)
    assert waiting.verdict == EXPLAINED


def test_an_ablated_step_the_device_computed_refutes_a_cause_that_predicts_it_otherwise():
    """bf16 ties away reproduces the device on a step; on the same step ablated, where the device computed the
    reference's bytes (the divergence vanished), it predicts other bytes: refuted, the divergence unexplained. Where
    the device's ablated bytes are its own (the divergence persisted) and the re-run predicts them, it stands."""
    g, inputs, expected = first_step("boundaries.r4-chunks-3-3-6-2")
    stage = "index_query_finalize"
    ties = Hypothesis("bf16:ties-away", "bf16 ties away", bf16="ties-away")
    device = run_stage(stage, g, inputs, expected, ties.numerics())

    def explained():
        cause = Trial(ties.key, ties.name, 0, 100, {"bf16": (3, 50)})
        explanation = Explanation("case", 0, stage, EXPLAINED, cause=cause, rivals=[cause], kernel="q.cu:entry")
        explanation.hypotheses = {ties.key: ties}
        return explanation

    vanished = Variant("scale=1", "scale = 1", g, inputs, expected, expected, 0)
    refuted = explained()
    entry._held_to_ablations(refuted, [vanished])
    assert refuted.verdict == UNEXPLAINED and refuted.closest.key == ties.key and list(refuted.refuted) == [ties.key]
    (experiment,) = refuted.experiments
    assert experiment["ablation"] == "scale=1" and experiment["unlike_device"][ties.key] > 0
    assert "re-run on it with scale = 1 it leaves" in refuted.headline()
    persisted = Variant("one-row", "only batch row b=0", g, inputs, expected, dict(expected, **{stage: device}), 9)
    kept = explained()
    entry._held_to_ablations(kept, [persisted])
    assert kept.verdict == EXPLAINED and kept.experiments[0]["unlike_device"] == {ties.key: 0}
    assert "its re-run predicts the device's bytes on 1 ablated variant of this step too" in kept.headline()
    kept.experiments.append({**kept.experiments[0], "unlike_device": {}})  # a variant the cause was not re-run on
    assert "on 1 ablated variant of this step too" in kept.headline()
    entry.settle_across_steps([kept])
    assert kept.verdict == EXPLAINED  # three arguments, reproduced again where the divergence persisted


def test_a_divergent_step_of_the_same_kernel_that_one_variant_reproduces_refutes_the_other():
    """Step 1 cannot tell exp2f everywhere from exp2f in the P·V weights alone; step 0, where only the latter
    reproduces the device, refutes the former."""
    kernel, stage = "attention.cu:entry", "sparse_sink_softmax_attention"
    full, weights = _trial("expf:exp2f", 0), _trial("weights-expf:exp2f", 0)
    settled = Explanation("case", 1, stage, EXPLAINED, cause=full, rivals=[full, weights], kernel=kernel)
    ambiguous = Explanation("other", 1, stage, AMBIGUOUS, rivals=[_trial("weights-expf:exp2f", 0), _trial("ftz", 0)],
                            kernel=kernel)
    step0 = Explanation("case", 0, stage, EXPLAINED, cause=weights, baseline=40, kernel=kernel,
                        trials=[_trial("expf:exp2f", 435), _trial("weights-expf:exp2f", 0), _trial("ftz", 12)])
    elsewhere = Explanation("case", 0, stage, EXPLAINED, cause=_trial("expf:exp2f", 0, changed=8),
                            kernel="another.cu:entry", trials=[_trial("expf:exp2f", 0), _trial("weights-expf:exp2f", 5)])
    entry.settle_across_steps([settled, ambiguous, step0, elsewhere])
    assert settled.verdict == EXPLAINED and settled.cause.key == "weights-expf:exp2f"
    assert [trial.key for trial in settled.rivals] == ["weights-expf:exp2f"] and list(settled.refuted) == ["expf:exp2f"]
    assert settled.refuted["expf:exp2f"]["step"] == 0
    assert ("expf:exp2f refuted on case step 0, a divergent step of this kernel that a rival reproduces: its re-run "
            "leaves 435 elements unlike the device's") in settled.headline()
    assert ambiguous.verdict == EXPLAINED and ambiguous.cause.key == "weights-expf:exp2f"
    assert list(ambiguous.refuted) == ["ftz"]
    assert elsewhere.cause.key == "expf:exp2f" and not elsewhere.refuted
    # where the same payload cannot tell them apart, one expf throughout comes before the P·V weights' alone
    equals = [_trial("weights-expf:device", 0, changed=1), _trial("expf:device", 0, changed=5)]
    assert min(equals, key=entry._simplest).key == "expf:device"
    # and a function some code computes before "correctly rounded" (a property of values): it names a call
    equals = [_trial("expf:correctly-rounded", 0, changed=2), _trial("expf:device-double", 0, changed=2),
              _trial("weights-expf:device-double", 0, changed=2)]
    assert min(equals, key=entry._simplest).key == "expf:device-double"


def test_ropes_sine_and_cosine_from_the_device_are_one_ingredient_beside_each_alone():
    """A kernel takes RoPE's sine and cosine from one sincosf (or one library): one step may show only the sine's
    difference and another only the cosine's, so each alone is refuted by the other step and only the pair is the
    kernel's rule."""
    from csa_conform.explain.hypotheses import stage_hypotheses
    from csa_conform.explain.search import acts_only_in_rope, ingredient

    found = {hypothesis.key: hypothesis for hypothesis in stage_hypotheses("compression_update", lambda name: name)}
    pair = found["sincosf:device"]
    assert dict(pair.libm) == {"sinf": "sinf", "cosf": "cosf"} and acts_only_in_rope(pair)
    assert len({ingredient(found[key]) for key in ("sinf:device", "cosf:device", "sincosf:device")}) == 3
    assert "sincosf:device" not in {hypothesis.key for hypothesis in stage_hypotheses("compression_update", None)}
    assert "sincosf:device" not in {hypothesis.key for hypothesis in stage_hypotheses(
        "sparse_sink_softmax_attention", lambda name: name)}


def test_a_cuda_runners_libm_is_measured_under_its_kernel_directory_and_build(tmp_path, monkeypatch):
    """The probe of a CUDA backend (here a stand-in with evaluate_libm), as a device run reaches it."""
    from types import SimpleNamespace

    import csa_conform.explain.device_libm as libm_module
    from csa_conform.device.kernels import BUILDS, Build
    from csa_conform.explain.device_libm import device_libm, measured

    monkeypatch.setattr(libm_module, "_MEASURED", {})  # the process's record of measured devices, this test's own

    build = Build("production", BUILDS["production"], "--build")
    backend = SimpleNamespace(evaluate_libm=lambda name, args, build: np.sin(args[0]),
                              info=lambda: SimpleNamespace(name="a stand-in device"))
    runner = SimpleNamespace(backend_call=lambda name, *args: getattr(backend, name)(*args), provider=None,
                             offers=lambda name: hasattr(backend, name),
                             kernels=SimpleNamespace(build=build, path=tmp_path))
    function, reason = device_libm(runner)
    assert reason is None
    function("sinf")(np.array([0.5, 1.0], dtype=np.float32))
    (entry,) = [entry for entry in measured() if entry["where"].startswith("a stand-in device")]
    assert entry["where"] == f"a stand-in device, {tmp_path}, build production"


def test_the_device_libm_is_measured_once_per_argument_and_counts_where_it_differs_from_glibc():
    from csa_conform.explain.device_libm import DeviceLibm
    from csa_conform.numerics.variant import GLIBC

    calls = []

    def probe(name, args, build):
        calls.append(args[0].size)
        found = np.array(GLIBC[name](*args), dtype=np.float32)
        found[args[0] == np.float32(0.5)] = np.nextafter(found[args[0] == np.float32(0.5)], np.float32(9))
        return found

    libm = DeviceLibm(probe, None, "a fake device")
    sinf = libm.function("sinf")
    first = sinf(np.array([[0.5, 1.0], [0.5, 2.0]], dtype=np.float32))
    again = sinf(np.array([2.0, 0.5, 3.0], dtype=np.float32))
    seen = sinf(np.array([3.0, 1.0, 0.5, 3.0], dtype=np.float32))
    assert calls == [3, 1], "each distinct argument goes to the device once"
    assert first.shape == (2, 2) and first[0, 0].view(np.uint32) == again[1].view(np.uint32)
    expected = np.array([again[2], first[0, 1], first[0, 0], again[2]])
    assert np.array_equal(seen.view(np.uint32), expected.view(np.uint32))
    assert first[0, 1] == GLIBC["sinf"](np.array([1.0], dtype=np.float32))[0]
    assert libm.measured() == {"sinf": {"arguments": 4, "differing": 1}}


def test_the_device_libm_asked_from_several_threads_measures_each_argument_once():
    """The oracle's query chunks evaluate a device-libm hypothesis on several threads at once."""
    from concurrent.futures import ThreadPoolExecutor

    from csa_conform.explain.device_libm import DeviceLibm
    from csa_conform.numerics.variant import GLIBC

    evaluated = []

    def probe(name, args, build):
        evaluated.extend(args[0].tolist())
        return np.nextafter(np.array(GLIBC[name](*args), dtype=np.float32), np.float32(9))

    libm = DeviceLibm(probe, None, "a fake device")
    chunks = [np.arange(start, start + 40, dtype=np.float32) / 64 for start in range(0, 320, 20)]  # overlapping
    with ThreadPoolExecutor(8) as pool:
        values = list(pool.map(libm.function("expf"), chunks))
    for chunk, found in zip(chunks, values):
        assert np.array_equal(found.view(np.uint32), np.nextafter(GLIBC["expf"](chunk), np.float32(9)).view(np.uint32))
    assert sorted(evaluated) == sorted(set(evaluated)) and len(evaluated) == 340
    assert libm.measured() == {"expf": {"arguments": 340, "differing": 340}}


def test_an_unexplained_divergence_a_structural_finding_names_is_counted_as_such():
    """The summary of a kernel that never writes its carry must not read as if nothing were found: its
    divergences stay unexplained (no cause), and the count says how many a structural finding names."""
    from csa_conform.cli.explanations import tally, tally_line
    from csa_conform.explain.patterns.findings import Finding
    from csa_conform.explain.verdict import UNEXPLAINED
    from csa_conform.report.html import explain_summary

    never_written = Finding("never-written", "compression_update", "present_compression_carry", "never written", 8, 8)
    restricted = Finding("restricted", "compression_update", "present_compressed_kv", "rows r >= 3", 8, 8)
    named = Explanation("a", 0, "compression_update", UNEXPLAINED, diagnosis=[never_written])
    searched = Explanation("b", 0, "compression_update", UNEXPLAINED, diagnosis=[never_written], search={"singles": 3})
    located = Explanation("c", 0, "compression_update", UNEXPLAINED, diagnosis=[restricted])
    counts = tally([named, searched, located])
    assert (counts["unexplained"], counts["structural"]) == (3, 1)
    assert tally_line([named, searched, located]).endswith("3 unexplained (1 of them named by a structural finding)")
    assert named.headline().startswith("a step 0 compression_update: never-written: never written (structural")
    assert tally_line([located]).endswith("1 unexplained")
    assert "1 unexplained (1 of them named by a structural finding), 0 failed" in explain_summary(tally([named]))


def test_strong_only_from_an_experiment_and_every_headline_sentence_a_claim_with_its_source():
    """A fit of many elements is at most moderate, an observation is observed, an experiment of 8 is strong;
    the headline is the lead claim followed by the others (probes and ablations append theirs the same way)."""
    from csa_conform.explain.claims import ABLATION, FIT, OBSERVATION, PROBE, RERUN, TRANSFORM, Claim
    from csa_conform.explain.patterns import Finding

    assert [Claim("x", source, 10_000).confidence for source in (FIT, OBSERVATION)] == ["moderate", "observed"]
    assert {Claim("x", source, 8).confidence for source in (TRANSFORM, RERUN, PROBE, ABLATION)} == {"strong"}
    with pytest.raises(ValueError):
        Claim("x", "inference")
    fit = Finding("sub-step", "compression_update", "present_compressed_kv", "consistent with ...", 50, 50,
                  {"support": 50})
    assert fit.confidence == "moderate" and fit.to_dict()["source"] == "fit"
    explanation = Explanation("case", 0, "compression_update", "unexplained", diagnosis=[fit],
                              claims=[Claim("the probe RMSNorm output differs first", PROBE, 12, {"probe": "rms"})])
    document = explanation.to_dict()
    assert [claim["source"] for claim in document["claims"]] == ["fit", "probe"]
    assert document["claims"][1]["confidence"] == "strong" and document["confidence"] == "moderate"
    assert explanation.headline().endswith("; the probe RMSNorm output differs first")


def test_a_cause_whose_re_run_leaves_other_steps_of_its_kernel_unlike_the_device_is_no_cause():
    """A reading that fits one step by coincidence (an input row read from index 0 where a wrong phase happened
    to read row 0) is refuted by the kernel's other steps: unexplained, the re-run its closest trial, and the
    headline says what the other steps showed, once."""
    from csa_conform.explain import settle_across_steps

    cause = Trial("offset:compressor_ape:0", "compressor_ape read without its offset along axis 0", 0, 100,
                  reproduced=40)
    missed = Trial("offset:compressor_ape:0", "compressor_ape read without its offset along axis 0", 7, 100)
    explained = Explanation("case", 3, "compression_update", EXPLAINED, ["present_compressed_kv: 40 differ"],
                            cause=cause, rivals=[cause], trials=[cause], kernel="k.cu:k")
    others = [Explanation("case", step, "compression_update", "unexplained", trials=[missed], kernel="k.cu:k")
              for step in (0, 1)]
    settle_across_steps([explained, *others])
    settle_across_steps([explained, *others])  # once per case and once over the run: said once
    assert explained.verdict == "unexplained" and explained.cause is None and explained.closest is cause
    assert explained.headline().count("reproduces this step bit for bit, but its re-run leaves 2 of 2 other "
                                      "divergent steps of this kernel and stage unlike the device, so it is not "
                                      "claimed as the cause") == 1
    assert explained.to_dict()["claims"][-1]["detail"] == {"unreproduced": 2, "tried": 2,
                                                           "trial": "offset:compressor_ape:0"}


def test_one_step_the_cause_leaves_unlike_the_device_is_enough_to_claim_no_cause():
    """A causal bound one record long fits the steps where the kernel's real bound (the step's length) agrees
    with it and misses the others: a rule the kernel follows holds on every step, and a second bug cannot be
    told from another rule, so the re-run that reproduces most steps is still not claimed as the cause."""
    from csa_conform.explain import settle_across_steps

    cause = Trial("causal:+1", "the causal record count (position+1)/4 computed as (position+2)/4", 0, 8,
                  reproduced=2)
    others = [Explanation("case", step, "index_scoring", "unexplained", kernel="k.cu:k",
                          trials=[Trial("causal:+1", cause.name, 0 if step < 3 else 5, 8)]) for step in range(1, 5)]
    explained = Explanation("case", 0, "index_scoring", EXPLAINED, ["scores: 2 differ"], cause=cause, rivals=[cause],
                            trials=[cause], kernel="k.cu:k")
    settle_across_steps([explained, *others])
    assert explained.verdict == "unexplained" and explained.cause is None and explained.closest is cause
    assert explained.headline().endswith("reproduces this step bit for bit, but its re-run leaves 2 of 4 other "
                                         "divergent steps of this kernel and stage unlike the device, so it is not "
                                         "claimed as the cause")


def test_rivals_that_each_leave_another_step_unlike_the_device_leave_the_divergence_unexplained():
    """Two readings that each reproduce the one or two differing candidates of every step they fit (a dense window
    one slot longer; causal records from the step's first position) and each miss one step: neither is the
    kernel's rule, so the ambiguous verdict between them claims nothing; one rival left explains."""
    from csa_conform.explain import settle_across_steps

    longer, early = (Trial("dense:one-longer", "the dense window one slot longer", 0, 8, reproduced=2),
                     Trial("records:from-step-start", "causal records from the step's first position", 0, 8,
                           reproduced=2))
    ambiguous = Explanation("case", 0, "candidate_assembly", AMBIGUOUS, ["candidates: 2 differ"],
                            rivals=[longer, early], trials=[longer, early], kernel="k.cu:k")
    others = [Explanation("case", 1, "candidate_assembly", "unexplained", kernel="k.cu:k",
                          trials=[Trial(longer.key, longer.name, 0, 8), Trial(early.key, early.name, 1, 8)]),
              Explanation("other", 0, "candidate_assembly", "unexplained", kernel="k.cu:k",
                          trials=[Trial(longer.key, longer.name, 18, 8),
                                  Trial(early.key, early.name, 0, 8, reproduced=6)])]
    settle_across_steps([ambiguous, *others])
    settle_across_steps([ambiguous, *others])
    headline = ambiguous.headline()
    assert ambiguous.verdict == "unexplained" and ambiguous.cause is None and not ambiguous.rivals
    assert headline.count("not claimed as the cause") == 2 and "ambiguous" not in headline
    survivor = Explanation("case", 0, "candidate_assembly", AMBIGUOUS, ["candidates: 2 differ"],
                           rivals=[longer, early], trials=[longer, early], kernel="k.cu:k")
    settle_across_steps([survivor, others[1]])
    assert survivor.verdict == EXPLAINED and survivor.cause is early


def test_a_reading_refuted_by_the_kernels_other_steps_leaves_the_lead_once_and_is_named_in_words():
    """An input reading that explained a step (its re-run's finding the lead) and that another divergent step of
    the kernel refutes: the finding leaves the diagnosis with the cause, and the headline names the reading in
    words, once, however often the run settles."""
    from csa_conform.explain import settle_across_steps
    from csa_conform.explain.structural import offset_finding

    name = "selected read without its offset along axis 0"
    cause = Trial("offset:selected:0", name, 0, 64, reproduced=12)
    finding = offset_finding("candidate_assembly", "candidates", 12, cause,
                             {"input": "selected", "shape": (2, 4, 8), "axis": 0})
    explained = Explanation("case", 0, "candidate_assembly", EXPLAINED, ["candidates: 12 differ"], cause=cause,
                            rivals=[cause], trials=[cause], kernel="k.cu:k", diagnosis=[finding])
    other = Explanation("case", 1, "candidate_assembly", "unexplained", kernel="k.cu:k",
                        trials=[Trial("offset:selected:0", name, 9, 64)])
    settle_across_steps([explained, other])
    settle_across_steps([explained, other])
    headline = explained.headline()
    assert explained.verdict == "unexplained" and not explained.diagnosis
    assert headline.count("not claimed as the cause") == 1 and f"{name} reproduces this step" in headline
    assert "offset:selected:0" not in headline


def test_a_rounding_convention_a_re_run_found_on_one_step_is_dropped_when_the_kernels_other_steps_refute_it():
    """bf16 by truncation reproduces one step of a kernel that skips a rounding altogether; the kernel's other
    divergent steps, where the same re-run leaves the device unlike, refute it as the cause."""
    from csa_conform.explain import settle_across_steps
    from csa_conform.explain.patterns import ROUNDING_CONVENTION, Finding

    key = "bf16:truncate"
    convention = Finding(ROUNDING_CONVENTION, "index_key_update", "present_index_key",
                         "the kernel's bf16 by truncation: 230 of 448 arguments round differently", 2, 2,
                         {"trial": key, "variant": "bf16 by truncation"}, "re-run")
    fitted = Explanation("case", 0, "index_key_update", "unexplained", diagnosis=[convention], kernel="k.cu:k")
    others = [Explanation("case", step, "index_key_update", "unexplained", kernel="k.cu:k",
                          trials=[Trial(key, "bf16 by truncation", 30, 100)]) for step in (1, 2)]
    settle_across_steps([fitted, *others])
    settle_across_steps([fitted, *others])
    assert fitted.diagnosis == [] and "the kernel's bf16 by truncation" not in fitted.headline()
    assert fitted.headline().count("bf16 by truncation reproduces this step bit for bit, but its re-run leaves 2 "
                                   "of 2 other divergent steps") == 1


def test_an_observation_of_reordered_ids_leaves_the_re_runs_to_name_the_reading():
    """Batch row 1 reading batch row 0's selection: its candidates row is, bit for bit, batch row 0's, and its own
    ids in another order too (two records, both selected): an observation of both that names no cause; the
    re-runs still run, and `selected` read without its batch offset reproduces the device."""
    g, inputs, expected = first_step("random.r4-bias-1")
    selection = {tensor: np.array(values) for tensor, values in expected["selection"].items()}
    for values in selection.values():
        values[1:] = values[0]
    device = run_stage("candidate_assembly", g, inputs, dict(expected, selection=selection), Numerics())
    explanation = explain_payload("candidate_assembly", g, inputs, expected, device)
    assert explanation.verdict == EXPLAINED, explanation.headline()
    assert "selected read without its offset along axis 0" in explanation.headline()
    (held,) = [finding for finding in explanation.diagnosis if finding.established_by == "observation"
               and finding.kind == "row-aliasing"]
    assert held.evidence["rows"] == {3: 1}
    assert held.headline == ("each differing row of candidates is, bit for bit, another of the reference's rows "
                             "(b=1, s=1 holds b=0, s=1's; 1 of 1 rows, the 2 differing elements at c = 128..129), "
                             "and its own row's values in another order: the bytes do not tell a row read at "
                             "another place from a reordering")


def test_a_stage_whose_launch_computed_a_divergent_upstream_says_so_before_any_sub_step():
    """Attention's launch assembled its own candidates and they diverged, but from them the reference's arithmetic
    does not reproduce attention (the read-back may not have identified every slot): the headline says so first,
    and the baseline is the reference's arithmetic on what the stage read."""
    from csa_conform.compare.bitwise import compare_payloads
    from csa_conform.explain import Divergence, explain_step

    g, inputs, expected = first_step("edges.r128-f32-b2-block-end-in-step")
    stage = "sparse_sink_softmax_attention"
    candidates = expected["candidate_assembly"]["candidates"].copy()
    candidates[0, 1, 126] = 10  # a dense slot the kernel attended elsewhere
    attention = {name: array.copy() for name, array in expected[stage].items()}
    attention["scores"][0, 0, :, 5] += np.float32(1.0)  # and a slot the read-back kept
    actual = dict(expected, candidate_assembly={"candidates": candidates}, **{stage: attention})
    diffs = [diff for diff in compare_payloads({stage: expected[stage]}, {stage: attention}) if not diff.passed]
    explanation = explain_step(Divergence("case", 0, stage, g, inputs, expected, actual, diffs), None, {})
    assert explanation.verdict != EXPLAINED
    assert explanation.claims[0].text.startswith("the same launch computed candidate_assembly itself and it "
                                                 "diverged too: from the device's candidate_assembly (as the runner "
                                                 "read it back off the scores: the kernel writes no candidate ids, "
                                                 "so a column read as one candidate may hold another) the "
                                                 "reference's arithmetic leaves")
    assert explanation.baseline == explanation.claims[0].detail["unlike_device"] > 0


def test_a_launchs_own_upstream_the_reference_refuses_is_said_so_and_leaves_the_baseline_alone():
    """Selection after its launch's own index scores tied: the reference computes no selection from them (its
    top-k tie order is not frozen), so the headline says that, and the baseline stays the stage's own count."""
    from csa_conform.compare.bitwise import compare_payloads
    from csa_conform.explain import Divergence, explain_step

    g, inputs, expected = first_step("boundaries.r4-prefill-8")
    stage = "selection"
    scores = expected["index_scoring"]["scores"].copy()
    scores[0, 7, 1] = scores[0, 7, 0]  # two equal scores in the last query's row
    selected = {name: np.array(array) for name, array in expected[stage].items()}
    selected["selected"][0, 7] = selected["selected"][0, 7][::-1]
    actual = dict(expected, index_scoring={"scores": scores}, **{stage: selected})
    diffs = [diff for diff in compare_payloads({stage: expected[stage]}, {stage: selected}) if not diff.passed]
    explanation = explain_step(Divergence("case", 0, stage, g, inputs, expected, actual, diffs), None, {})
    assert explanation.claims[0].text.startswith("the same launch computed index_scoring itself and it diverged "
                                                 "too: from the device's index_scoring the reference computes no "
                                                 "selection: it does not support those inputs (portable top-k tie "
                                                 "ordering is unfrozen")
    assert explanation.baseline == sum(diff.mismatches for diff in diffs) > 0


def test_one_index_moved_along_an_axis_is_no_shift_of_every_index():
    """Every batch writing batch 0's selection rows, the last writer (b = 2) winning, leaves b = 0 holding b = 2's
    row: one alias, not "b = k holds b = k + 2"; two rows moved by the same offset are a shift, or, where the rows
    they came from keep their own values, the values held twice."""
    from csa_conform.explain.patterns.shift import index_shift
    from csa_conform.numerics.bits import differing_bits

    expected = np.random.default_rng(3).permutation(3 * 16).reshape(3, 16).astype(np.int32)
    one = expected.copy()
    one[0] = expected[2]  # b = 1 and 2 have no b + 2: only b = 0 can show the offset
    assert index_shift("selection", "selected", expected, one, differing_bits(expected, one), ("b", "k"), None) is None
    expected = np.random.default_rng(3).permutation(4 * 16).reshape(4, 16).astype(np.int32)
    two = expected.copy()
    two[0], two[1] = expected[2], expected[3]
    found = index_shift("selection", "selected", expected, two, differing_bits(expected, two), ("b", "k"), None)
    assert found is not None and found.evidence["axis"] == "b" and found.evidence["shift"] == 2
    assert found.kind == "row-aliasing" and "holds values twice along b" in found.headline
    moved = np.roll(expected, -1, axis=0)  # row k holds row k+1: each row's values moved on, none kept in place
    found = index_shift("selection", "selected", expected, moved, differing_bits(expected, moved), ("b", "k"), None)
    assert found is not None and found.kind == "index-shift" and found.evidence["shift"] == 1
    assert "is shifted along b" in found.headline


def test_an_ambiguous_headline_counts_the_steps_and_the_ablated_variants_that_separated_nothing():
    rivals = [_trial("expf:exp2f", 0), _trial("ftz", 0)]
    witness = {"case": "c", "step": 1, "predicted_differing": {"expf:exp2f": 0, "ftz": 0}, "device_differing": 0}
    ablated = {"case": "c", "step": 0, "ablation": "one-row", "change": "only batch row b=0", "predicted_differing": {},
               "device_differing": 5, "unlike_device": {"expf:exp2f": 0, "ftz": 0}}
    explanation = Explanation("c", 0, "sparse_sink_softmax_attention", AMBIGUOUS, rivals=rivals,
                              experiments=[witness, dict(witness, step=2), ablated])
    assert explanation.headline().endswith("2 experiments on steps of this kernel and 1 ablated variant of this step "
                                           "separated none of them")
    assert Explanation("c", 0, "selection", AMBIGUOUS, rivals=rivals).headline().endswith(
        "no experiment separated them")


def test_an_ablated_selection_holds_a_cause_to_what_its_isolated_replicate_wrote():
    """An ablated step runs isolated: the replicate launch copies the oracle's selected, not the one the device's
    selection wrote. A sort-key cause that reproduces the device's selected is held to that: predicted, not
    refuted by selected_indices it never wrote; another ordering leaves the device's selected unlike it."""
    from csa_conform.explain.experiments import on_ablations

    g, inputs, expected = first_step("edges.r4-n8-i5-k5")
    flipped = Hypothesis("selection:sign-flipped-key", "", port=(("selection_key", "sign-flipped"),))
    raw = Hypothesis("selection:raw-bits-key", "", port=(("selection_key", "raw-bits"),))
    device = run_stage("selection", g, inputs, expected, flipped.numerics())
    actual = dict(expected, selection={"selected": device["selected"],
                                       "selected_indices": expected["selection"]["selected_indices"]})
    variant = Variant("one-row", "only batch row b=0", g, inputs, expected, actual, 48)
    (experiment,) = on_ablations("selection", "case", 0, [variant], [flipped, raw])
    assert experiment["unlike_device"]["selection:sign-flipped-key"] == 0
    assert experiment["unlike_device"]["selection:raw-bits-key"] > 0
