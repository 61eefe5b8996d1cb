"""A step of the data flow ported another way is named as the cause only by a re-run that reproduces the
device bit for bit (the pool, the RMSNorm, the FP8 codes, the causal count, the head weight scale, the
selection's filler and sort key, the dense window's length and causal bound, the sink in the running max), and
a hypothesis about how a kernel reads its data is re-run on conformant steps reading their inputs the same way."""

from __future__ import annotations

import numpy as np
import pytest

from csa_conform.check.model import CaseVerdict, StageVerdict
from csa_conform.contract import validate_step
from csa_conform.explain import EXPLAINED
from csa_conform.explain.experiments import Witnesses
from csa_conform.explain.hypotheses import Hypothesis
from csa_conform.explain.stages import run_stage
from csa_conform.explain.structural import layout_trials, offset_trials, read_as
from csa_conform.golden import GoldenFile
from csa_conform.golden.carries import cleared_carry
from csa_conform.numerics.variant import Numerics

from ci_steps import CI_GOLDENS, explain_payload, first_step

PORTED = [
    ("boundaries.r4-prefill-8", "compression_update", {"overlap_boundary": 1}, "pool:boundary+1", "pool:boundary-1"),
    ("boundaries.r4-prefill-8", "index_key_update", {"overlap_boundary": -1}, "pool:boundary-1", "pool:boundary+1"),
    ("boundaries.r128-resumed-119-chunks", "compression_update", {"pool_skipped": "first"}, "pool:first-left-out",
     "pool:last-left-out"),
    ("boundaries.r128-resumed-119-chunks", "compression_update", {"codes_truncated": True}, "codes:truncate",
     "codes:ties-away"),
    ("boundaries.r128-resumed-119-chunks", "compression_update", {"rms_norm": "sum"}, "rms:sum", "rms:unweighted"),
    ("boundaries.r4-prefill-8", "index_key_update", {"rms_norm": "unweighted"}, "rms:unweighted", "rms:sum"),
    ("edges.r128-fp8-rope-65536", "compression_update", {"rms_norm": "binary64-squares"}, "rms:binary64-squares",
     "rms:sum"),
    ("boundaries.r4-prefill-8", "index_scoring", {"causal_shift": -1}, "causal:-1", "causal:+1"),
    ("boundaries.r4-prefill-8", "index_scoring", {"scale_folding": "without-heads"}, "scale:without-heads",
     "scale:heads-unrooted"),
    ("boundaries.r4-prefill-8", "index_scoring", {"scale_folding": "heads-unrooted"}, "scale:heads-unrooted",
     "scale:folded"),
    ("boundaries.r4-prefill-8", "selection", {"selection_pad": 0}, "selection:pad-0", None),
    ("boundaries.r4-prefill-8", "selection", {"selection_over_cache": True}, "selection:over-cache",
     "selection:pad-0"),
    ("edges.r4-n8-i5-k5", "selection", {"selection_key": "sign-flipped"}, "selection:sign-flipped-key",
     "selection:raw-bits-key"),
    ("edges.r4-n8-i5-k5", "selection", {"selection_key": "raw-bits"}, "selection:raw-bits-key",
     "selection:sign-flipped-key"),
    ("boundaries.r4-prefill-8", "candidate_assembly", {"dense_extra": 1}, "dense:one-longer",
     "dense:own-position-left-out"),
    ("boundaries.r4-prefill-8", "candidate_assembly", {"dense_strict": True}, "dense:own-position-left-out",
     "dense:one-longer"),
    ("edges.r128-f32-b2-block-end-in-step", "candidate_assembly", {"from_step_start": frozenset({"dense window"})},
     "dense:from-step-start", "records:from-step-start"),
    ("edges.r128-f32-b2-block-end-in-step", "candidate_assembly", {"from_step_start": frozenset({"causal records"})},
     "records:from-step-start", "dense:from-step-start"),
    ("boundaries.r4-prefill-5", "sparse_sink_softmax_attention", {"sink_in_max": True}, "softmax:sink-in-max",
     "softmax:reciprocal"),
]


@pytest.mark.parametrize("case, stage, port, key, rival", PORTED, ids=[row[3] for row in PORTED])
def test_a_step_ported_another_way_is_the_cause_its_re_run_reproduces(case, stage, port, key, rival):
    g, inputs, expected = first_step(case)
    device = run_stage(stage, g, inputs, expected, Numerics(**port))
    explanation = explain_payload(stage, g, inputs, expected, device)
    assert explanation.verdict == EXPLAINED and explanation.cause.key == key, explanation.headline()
    assert explanation.cause.reproduces and explanation.cause.reproduced == explanation.baseline
    assert not any(trial.reproduces for trial in explanation.trials if trial.key != key)
    if rival is not None:  # a rival of the same step was tried too
        assert any(trial.key == rival and trial.rejected is None for trial in explanation.trials)


def test_a_reading_is_re_run_on_a_witness_reading_its_inputs_the_same_way():
    """index_weight read without its offset along s: on a conformant step the re-run reads that step's weights
    the same wrong way and predicts differing scores, which the device did not compute; the reference's
    arithmetic predicts none."""
    case, stage = "boundaries.r4-prefill-8", "index_scoring"
    g, inputs, expected = first_step(case)
    reading = next(hypothesis for hypothesis, *_ in offset_trials(stage, g, inputs, expected, expected[stage])
                   if hypothesis.key == "offset:index_weight:1")
    with GoldenFile(CI_GOLDENS) as golden:
        report = CaseVerdict(case, ratio=g.ratio, step_count=golden.step_count(case))
        report.stages[stage] = StageVerdict(stage, "device", "identical")
        experiments = Witnesses(golden, [report]).run(stage, g.ratio, [reading, Hypothesis("reference", "")])
    assert experiments and experiments[0]["predicted_differing"]["reference"] == 0
    assert experiments[0]["predicted_differing"]["offset:index_weight:1"] > 0


def test_the_steps_before_a_case_diverged_are_witnesses():
    """A chained run that diverged first at step 1 matched every stage at step 0, on the reference's inputs."""
    diverged = CaseVerdict("later", ratio=4, step_count=3)
    diverged.stages["index_scoring"] = StageVerdict("index_scoring", "device", "diverged", step=1)
    at_once = CaseVerdict("at-once", ratio=4, step_count=3)
    at_once.stages["index_scoring"] = StageVerdict("index_scoring", "device", "diverged", step=0)
    host = CaseVerdict("host", ratio=4, step_count=3)
    host.stages["index_scoring"] = StageVerdict("index_scoring", "host", "identical")
    passed = CaseVerdict("passed", ratio=4, step_count=3)
    passed.stages["index_scoring"] = StageVerdict("index_scoring", "device", "identical")
    cases = Witnesses(None, [diverged, at_once, host, passed]).cases("index_scoring", 4)
    assert [(report.case, steps) for report, steps in cases] == [("passed", 3), ("later", 1)]


def test_a_bias_read_with_two_axes_exchanged_is_one_reading_on_every_bias_rank():
    """attention_bias broadcasts right-aligned to [B, N, S, C]: an [N, S, C] bias read with its first two axes
    exchanged is the reading that exchanges a [B, N, S, C] bias's N and S, the same hypothesis on a step of
    either rank (a witness of the other rank must not refute the true cause)."""
    stage = "sparse_sink_softmax_attention"
    readings = {}
    for case in ("random.r4-bias-NS1", "random.r4-bias-BNS1"):
        g, inputs, expected = first_step(case)
        readings[case] = {hypothesis.key: hypothesis for hypothesis, *_ in
                          layout_trials(stage, g, inputs, expected, expected[stage])}
        assert readings[case]["layout:attention_bias:12"].name == \
            "attention_bias read with its N and S axes exchanged in memory"
    _, inputs, _ = first_step("random.r4-bias-BNS1")
    read, _ = readings["random.r4-bias-NS1"]["layout:attention_bias:12"].reading(inputs, {})
    bias = np.asarray(inputs["attention_bias"])
    assert bias.ndim == 4 and np.array_equal(read["attention_bias"], read_as(bias, 1, 2))


def test_a_reading_that_fits_by_coincidence_is_refuted_by_a_step_that_resumes_a_stream():
    """A kernel that clears the carry whenever no record precedes the step (not only at position 0): on
    step 1 of a stream in its first block, reading the past carry without its slot offset reads slot 0, which
    is cleared there, so that reading reproduces the device bit for bit on thousands of elements. A
    conformant step that resumes a stream with a real carry refutes it, however strong the fit: the cause is
    not claimed."""
    case, stage = "boundaries.r4-chunks-3-3-6-2", "compression_update"
    with GoldenFile(CI_GOLDENS) as golden:
        info, step = golden.case_info(case), golden.read_step(case, 1)
        g = validate_step(info.attrs, step.inputs, info.output_names)
        cleared = dict(step.inputs, past_compression_carry=cleared_carry(step.inputs["past_compression_carry"].shape))
        device = run_stage(stage, g, cleared, step.stages, Numerics())
        resumed = "edges.r4-n1-i2-k2-b2-past128"
        report = CaseVerdict(resumed, ratio=4, step_count=golden.step_count(resumed))
        report.stages[stage] = StageVerdict(stage, "device", "identical")
        explanation = explain_payload(stage, g, step.inputs, step.stages, device, Witnesses(golden, [report]))
    assert any(trial.key == "offset:past_compression_carry:1" and trial.reproduces for trial in explanation.trials)
    assert "offset:past_compression_carry:1" in explanation.refuted
    assert explanation.verdict != EXPLAINED and "without its offset" not in explanation.headline()


def test_a_witness_without_what_a_reading_reads_tests_nothing():
    """A bias read with two axes exchanged, re-run on a conformant step that has no bias (or one of too low a
    rank): that step holds nothing the reading reads, so it predicts nothing there (and raises nothing)."""
    stage = "sparse_sink_softmax_attention"
    g, inputs, expected = first_step("random.r4-bias-BNS1")
    reading = next(hypothesis for hypothesis, *_ in layout_trials(stage, g, inputs, expected, expected[stage])
                   if hypothesis.key == "layout:attention_bias:12")
    offset = next(hypothesis for hypothesis, *_ in offset_trials(stage, g, inputs, expected, expected[stage])
                  if hypothesis.key == "offset:attention_bias:0")
    _, plain, _ = first_step("boundaries.r4-prefill-8")
    _, scalar, _ = first_step("random.r4-bias-1")
    assert "attention_bias" not in plain and np.ndim(scalar["attention_bias"]) < 3
    for witness in (plain, scalar):
        assert reading.reading(witness, {}) is None and offset.reading(witness, {}) is None
    with GoldenFile(CI_GOLDENS) as golden:
        report = CaseVerdict("boundaries.r4-prefill-8", ratio=4, step_count=1)
        report.stages[stage] = StageVerdict(stage, "device", "identical")
        experiments = Witnesses(golden, [report]).run(stage, 4, [reading, Hypothesis("reference", "")])
    assert experiments and experiments[0]["predicted_differing"] == {"reference": 0}


def test_a_strict_dense_bound_leaves_each_querys_own_position_out():
    """An 8-token prefill: query s attends positions 0..s of its dense window; with a strict bound, 0..s-1 (query 0
    none), the rest of the row as it was."""
    from csa_conform.oracle.candidate_assembly import candidate_assembly

    g, inputs, expected = first_step("boundaries.r4-prefill-8")
    reference = candidate_assembly(g, expected["selection"]["selected"])["candidates"]
    strict = candidate_assembly(g, expected["selection"]["selected"], dense_strict=True)["candidates"]
    assert reference[0, 2, :4].tolist() == [0, 1, 2, -1]
    assert strict[0, 2, :4].tolist() == [0, 1, -1, -1]
    assert strict[0, 0, :8].tolist() == [-1] * 8
    assert (strict[..., 8:] == reference[..., 8:]).all()
