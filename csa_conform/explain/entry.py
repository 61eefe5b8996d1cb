"""explain's entry points: one divergence (explain_step), one case's chained report (explain_report), one
case from scratch (explain_case).

Each divergent (case, step, stage) is first localized: the case is replayed
isolated, so a stage is judged on the oracle's inputs and upstream noise is
excluded (a stage that diverges only chained inherits it). Its pattern is
diagnosed first (csa_conform.explain.structural); a decisive structural
pattern no numeric ingredient can produce ends there. Otherwise every
sub-step re-run and every numeric single is tried (csa_conform.explain.search)
and all that reproduce the device bit for bit are kept: one ingredient
(perhaps in several variants that computed the same values) is the cause;
rivals of different ingredients make the verdict ``ambiguous``, naming all.
An explanation that fails inside csa-conform is ``failed``: the divergence
stays reported, the other verdicts are kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from csa_conform.check.conformance import check_case, compare_step, replay
from csa_conform.check.model import CaseVerdict
from csa_conform.compare.bitwise import TensorDiff
from csa_conform.contract import StepGeometry, validate_step
from csa_conform.device.kernels import KernelDirectory
from csa_conform.device.launches import kernel_of
from csa_conform.device.runner import DeviceRunner
from csa_conform.errors import ContractError, InternalError, operator_message
from csa_conform.explain.ablation import NOT_RUN, ablate, ablation_claim, ablation_runner
from csa_conform.explain.claims import FIT, OBSERVATION, PROBE, RERUN, STRONG, Claim
from csa_conform.explain.device_libm import device_libm as probe_device_libm
from csa_conform.explain.earlier import earlier_sub_step
from csa_conform.explain.element import element_provenance
from csa_conform.explain.experiments import Witnesses, on_ablations, refuted
from csa_conform.explain.hypotheses import SUB_STEPS, WEIGHTS_ONLY, Hypothesis, structural_hypotheses
from csa_conform.explain.patterns import (LAYOUT, MIN_SUPPORT, PERMUTATION, SCALE_EXPONENT, STRUCTURAL, SUB_STEP, Finding,
                                         stage_findings)
from csa_conform.explain.patterns.substeps import STREAMED, localize
from csa_conform.explain.probes import PROBED, probe_claim, probe_step
from csa_conform.explain.rows import Rerun
from csa_conform.explain.search import ingredient, search
from csa_conform.explain.stages import UPSTREAM_IN_LAUNCH, consumed_upstream, judged_tensors, mismatches, run_stage
from csa_conform.explain.structural import (
    diagnose_stage,
    layout_finding,
    layout_trials,
    offset_finding,
    offset_trials,
    sub_step_finding,
    sub_step_trials,
    unwritten_state,
)
from csa_conform.explain.values import value_classes
from csa_conform.explain.trial import Trial
from csa_conform.explain.verdict import AMBIGUOUS, EXPLAINED, FAILED, INHERITED, UNEXPLAINED, Explanation
from csa_conform.golden import GoldenFile
from csa_conform.numerics.variant import Numerics
from csa_conform.spec import BY_NAME, STAGE_NAMES, Mode

# stages whose first-element provenance reads the oracle's intermediates (FP8/FP4 block inputs)
TRACED_PROVENANCE = ("compression_update", "index_key_update", "index_query_finalize")


def _first_element(stage: str, diffs, g, inputs, expected) -> dict | None:
    first = next((diff for diff in diffs if diff.first is not None), None)
    if first is None:
        return None
    coords = tuple(int(i) for i in np.unravel_index(first.first["index"], first.shape))
    trace: dict = {}
    if stage in TRACED_PROVENANCE:  # the block inputs of a record or query; other stages need no re-run
        try:
            run_stage(stage, g, inputs, expected, Numerics(trace=trace))
        except ContractError:
            trace = {}
    return {"tensor": first.tensor, "coords": first.first["coords"],
            **element_provenance(stage, first.tensor, coords, g, inputs, expected, trace)}


def _decide(explanation: Explanation, reproducing, localized, witnesses: Witnesses | None = None,
            ratio: int = 0) -> None:
    """The verdict from every reproducing (hypothesis, trial): one ingredient explains (its variants listed
    as equals), rivals of several ingredients are ambiguous; a reproducing sub-step re-run adds its finding.
    Rivals, or a cause on less than strong evidence, are first re-run on the conformant steps of the same
    kernel (``witnesses``): what the device refutes there is dropped."""
    if not reproducing:
        return
    explanation.hypotheses.update((trial.key, hypothesis) for hypothesis, trial in reproducing)
    groups: dict[str, list] = {}
    for hypothesis, trial in reproducing:
        groups.setdefault(ingredient(hypothesis), []).append((hypothesis, trial))
    if witnesses is not None and (len(groups) > 1 or all(trial.confidence != "strong" for _, trial in reproducing)):
        explanation.experiments = witnesses.run(explanation.stage, ratio, [hypothesis for hypothesis, _ in reproducing])
        explanation.refuted = refuted(explanation.experiments)
        kept = {key: [pair for pair in group if pair[1].key not in explanation.refuted]
                for key, group in groups.items()}
        groups = {key: group for key, group in kept.items() if group}
        if not groups:
            explanation.note = ("every hypothesis that reproduces it is refuted by the device on a conformant step of "
                                "this kernel: " + "; ".join(f"{key} on {e['case']} step {e['step']}"
                                                            for key, e in explanation.refuted.items()))
            return
    if len(groups) > 1:
        explanation.verdict = AMBIGUOUS
        explanation.rivals = [min(group, key=lambda pair: pair[1].support)[1] for group in groups.values()]
        return
    (group,) = groups.values()
    hypothesis, cause = min(group, key=lambda pair: _simplest(pair[1]))
    explanation.verdict, explanation.cause = EXPLAINED, cause
    explanation.rivals = [trial for _, trial in group]
    if hypothesis.sub_step:
        explanation.diagnosis.insert(0, sub_step_finding(explanation.stage, explanation.tensors(),
                                                         explanation.baseline, hypothesis, cause, localized))


def _simplest(trial) -> tuple[bool, bool, int]:
    """The order a cause is chosen in among equal variants: one function throughout before the P·V weights' alone
    (the same payload says nothing of the denominator's); then a function some code computes (the device's own,
    its double one rounded once, a glibc port) before "correctly rounded", which is a property of the values
    and names no call in the kernel's code; then the fewest changed arguments."""
    return (trial.key.startswith(WEIGHTS_ONLY), trial.key.endswith(":correctly-rounded"),
            sum(changed for changed, _ in trial.changed.values()))


def settle_across_steps(explanations: Sequence[Explanation], final: bool = True) -> None:
    """Rivals (of an ambiguous verdict, or an explained one's equal variants) decided by the run's other
    divergent steps of the same kernel and stage: where one rival's re-run reproduces the device bit for bit
    and another's does not, the device refuted the other (one kernel, one arithmetic). A single survivor of an
    ambiguous verdict explains the divergence, unless it is a sub-step re-run (its finding needs the re-run's
    own evidence); an explained verdict whose cause was refuted takes the surviving variant changing fewest
    arguments. Only the ``final`` pass, over every divergent step there will be, drops a cause for want of a step
    that confirms it."""
    readings = [hypothesis for ratio in (4, 128) for stage in STAGE_NAMES
                for hypothesis in structural_hypotheses(stage, ratio)]
    structural = {hypothesis.key for hypothesis in readings}
    sub_steps = {hypothesis.key for hypothesis in readings if hypothesis.sub_step}
    for explanation in explanations:
        if explanation.verdict not in (AMBIGUOUS, EXPLAINED) or len(explanation.rivals) < 2:
            continue
        try:
            _settle(explanation, explanations, structural)
        except Exception as error:  # noqa: BLE001 - a bug of csa-conform: this explanation's verdict says so
            explanation.verdict, explanation.note = FAILED, failure_note(error)
    for explanation in explanations:
        if explanation.verdict == AMBIGUOUS:
            _rivals_unreproduced_elsewhere(explanation, explanations, sub_steps)
        if explanation.verdict == EXPLAINED and explanation.cause is not None:
            _unreproduced_elsewhere(explanation, explanations)
        if final and explanation.verdict == EXPLAINED and explanation.cause is not None:
            _unconfirmed_alone(explanation, explanations)
        lead = explanation.diagnosis[0] if explanation.diagnosis else None
        if (explanation.verdict == UNEXPLAINED and lead is not None and lead.established_by == RERUN
                and "trial" in lead.evidence):
            _finding_unreproduced_elsewhere(explanation, explanations, lead)
        _probe_leads(explanation)


def _unreproduced_elsewhere(explanation: Explanation, explanations: Sequence[Explanation]) -> None:
    """A cause whose same re-run leaves another divergent step of the kernel and stage unlike the device is no
    cause (one kernel, one arithmetic: that step refutes it): the divergence stays unexplained, the re-run its
    closest trial, and the headline says what the other steps showed, so that a reading which fits some steps
    by coincidence (a causal bound one record long where the kernel's bound is the step's length) is not read
    as the kernel's bug. A second bug could also leave such a step unlike; the re-run cannot tell the two
    apart, so it claims neither."""
    trial = explanation.cause
    missed, tried = _tried_elsewhere(explanation, explanations, trial.key)
    if missed:  # a rule the kernel follows holds on every step
        explanation.verdict, explanation.cause, explanation.rivals, explanation.closest = UNEXPLAINED, None, [], trial
        explanation.diagnosis = [finding for finding in explanation.diagnosis  # the cause's own finding goes too
                                 if finding.evidence.get("trial") != trial.key]
        explanation.claims.append(_no_cause(trial.name, trial.key, missed, tried))


def _unconfirmed_alone(explanation: Explanation, explanations: Sequence[Explanation]) -> None:
    """A cause is claimed on strong evidence only: at least 8 changed arguments or reproduced elements, counted
    over this step and every other the same re-run reproduces bit for bit (the run's other divergent steps, in
    any kernel: one build, one shared prelude; the ablated steps where the divergence persists). Two arguments
    rounding another way fit some other change of the same arithmetic by coincidence (a RoPE angle summed in
    another association moves the elements an FMA contraction moves, on the ablated steps too). Below that the
    divergence stays unexplained, the re-run its closest trial."""
    trial = explanation.cause
    if trial.confidence == "strong":
        return
    own = _support_on(explanation, trial)
    others = [_support_on(other, other_trial) for other in explanations if other is not explanation
              for other_trial in other.trials if other_trial.key == trial.key and other_trial.reproduces]
    support = own + sum(others)
    if support >= STRONG:
        if own < STRONG:
            explanation.claims.append(Claim(
                f"with the {len(others)} other divergent step{'s' if len(others) != 1 else ''} of this run it "
                f"reproduces bit for bit, {support} changed arguments or reproduced elements in all (a cause needs "
                f"{STRONG})", RERUN, support, {"confirmed_by_steps": len(others), "trial": trial.key}))
        return
    explanation.verdict, explanation.cause, explanation.rivals, explanation.closest = UNEXPLAINED, None, [], trial
    explanation.diagnosis = [finding for finding in explanation.diagnosis
                             if finding.evidence.get("trial") != trial.key]
    explanation.claims.append(Claim(
        f"{trial.name} reproduces this step bit for bit, but on {trial.strength().split(': ', 1)[1]}, {support} with "
        f"every other step it reproduces (fewer than {STRONG}), so it is not claimed as the cause", RERUN, support,
        {"unconfirmed": True, "trial": trial.key}))


def _support_on(explanation: Explanation, trial: Trial) -> int:
    """A reproducing re-run's evidence on one divergent step: its own changed arguments or elements, and the
    differing elements of the step's ablated variants it predicts too. The same sum for every step, so the run's
    steps that share a cause all keep it or all lose it."""
    return trial.support + sum(variant["device_differing"] for variant in explanation.ablated_agreeing(trial.key))


def _rivals_unreproduced_elsewhere(explanation: Explanation, explanations: Sequence[Explanation],
                                   sub_steps: set[str]) -> None:
    """The rule of ``_unreproduced_elsewhere`` for each rival of an ambiguous verdict: a rival whose re-run leaves
    another divergent step of the kernel and stage unlike the device is no candidate. With none left the divergence
    is unexplained (rivals that each fit a few elements of every step by coincidence, and each miss one step, name
    no cause between them); with one left it explains, unless it is a sub-step re-run (its finding needs the
    re-run's own evidence)."""
    dropped = []
    for trial in explanation.rivals:
        missed, tried = _tried_elsewhere(explanation, explanations, trial.key)
        if missed:
            dropped.append(trial)
            explanation.claims.append(_no_cause(trial.name, trial.key, missed, tried))
    if dropped:
        _drop_rivals(explanation, dropped, lambda key: key in sub_steps)


def _drop_rivals(explanation: Explanation, dropped: list, sub_step: Callable[[str], bool]) -> None:
    """The verdict once an experiment refuted the rivals ``dropped``: none left, the divergence is unexplained (the
    first dropped its closest trial, their findings gone); an explained verdict whose cause went takes the surviving
    variant changing fewest arguments; an ambiguous one left one rival explains, unless it is a sub-step re-run (its
    finding needs the re-run's own evidence)."""
    gone = {trial.key for trial in dropped}
    explanation.rivals = [trial for trial in explanation.rivals if trial.key not in gone]
    if not explanation.rivals:
        explanation.verdict, explanation.cause, explanation.closest = UNEXPLAINED, None, dropped[0]
        explanation.diagnosis = [finding for finding in explanation.diagnosis
                                 if finding.evidence.get("trial") not in gone]
    elif explanation.verdict == EXPLAINED:
        if explanation.cause.key in gone:
            explanation.cause = min(explanation.rivals, key=_simplest)
    elif len(explanation.rivals) == 1 and not sub_step(explanation.rivals[0].key):
        explanation.verdict, explanation.cause = EXPLAINED, explanation.rivals[0]


def _finding_unreproduced_elsewhere(explanation: Explanation, explanations: Sequence[Explanation],
                                    lead: Finding) -> None:
    """A finding a re-run established (a rounding convention, a sub-step done another way) refuted as a cause
    is, by the kernel's other divergent steps: dropped from the lead, and the headline says what they showed."""
    key = lead.evidence["trial"]
    missed, tried = _tried_elsewhere(explanation, explanations, key)
    if missed:
        explanation.diagnosis = explanation.diagnosis[1:]
        name = next((trial.name for trial in explanation.trials if trial.key == key), lead.evidence.get("variant", key))
        explanation.claims.append(_no_cause(name, key, missed, tried))


def _tried_elsewhere(explanation: Explanation, explanations: Sequence[Explanation], key: str) -> tuple[int, int]:
    """How many of the other divergent steps of the explanation's kernel and stage that re-ran ``key`` it left
    unlike the device, and how many re-ran it."""
    there = [trial for other in explanations if other is not explanation and other.verdict != INHERITED
             and (other.kernel, other.stage) == (explanation.kernel, explanation.stage)
             for trial in other.trials if trial.key == key and trial.rejected is None]
    return sum(not trial.reproduces for trial in there), len(there)


def _no_cause(name: str, key: str, missed: int, tried: int) -> Claim:
    return Claim(f"{name} reproduces this step bit for bit, but its re-run leaves {missed} of {tried} other "
                 f"divergent step{'s' if tried != 1 else ''} of this kernel and stage unlike the device, so it is "
                 "not claimed as the cause", RERUN, missed, {"unreproduced": missed, "tried": tried, "trial": key})


def _settle(explanation: Explanation, explanations: Sequence[Explanation], structural: set[str]) -> None:
    """One explanation's rivals decided by the other divergent steps of the same kernel and stage."""
    keys = [trial.key for trial in explanation.rivals]
    for other in explanations:
        if other is explanation or (other.kernel, other.stage) != (explanation.kernel, explanation.stage):
            continue
        there = {trial.key: trial for trial in other.trials if trial.key in keys and trial.rejected is None}
        if not any(trial.reproduces for trial in there.values()):
            continue
        for key, trial in there.items():
            if not trial.reproduces and key not in explanation.refuted:
                explanation.refuted[key] = {"case": other.case, "step": other.step, "predicted_differing": {},
                                            "device_differing": other.baseline,
                                            "unlike_device": {key: trial.mismatches}}
                explanation.experiments.append(explanation.refuted[key])
    left = [trial for trial in explanation.rivals if trial.key not in explanation.refuted]
    if explanation.verdict == EXPLAINED:
        explanation.rivals = left
        if explanation.cause not in left:
            explanation.cause = min(left, key=_simplest)
    elif len(left) == 1 and left[0].key not in structural:
        explanation.verdict, explanation.cause, explanation.rivals = EXPLAINED, left[0], left


@dataclass(frozen=True)
class Divergence:
    """One divergent stage of one step, re-run isolated: the oracle's and the device's stage payloads
    (stage -> tensor -> array) and the failing tensor diffs between them."""

    case: str
    step: int
    stage: str
    g: StepGeometry
    inputs: Mapping[str, np.ndarray]
    expected: Mapping[str, Mapping[str, np.ndarray]]
    actual: Mapping[str, Mapping[str, np.ndarray]]
    diffs: Sequence[TensorDiff]


def explain_step(divergence: Divergence, device_libm: Callable[[str], Callable] | None, skipped: dict[str, str],
                 witnesses: Witnesses | None = None) -> Explanation:
    """Explain one isolated divergence; ``witnesses``, the run's conformant cases, are the experiments that
    may separate rival hypotheses."""
    case, step, stage, g = divergence.case, divergence.step, divergence.stage, divergence.g
    inputs, expected, actual, diffs = divergence.inputs, divergence.expected, divergence.actual, divergence.diffs
    explanation = Explanation(case, step, stage, UNEXPLAINED, [diff.summary() for diff in diffs],
                              skipped=dict(skipped) if BY_NAME[stage].libm else {},
                              kernel=kernel_of(stage, g.ratio, [diff.tensor for diff in diffs]))
    target = judged_tensors(stage, actual[stage], {diff.tensor for diff in diffs})
    upstream = consumed_upstream(stage, expected, actual)
    own = UPSTREAM_IN_LAUNCH.get(stage)
    inherited = None
    if own in actual and mismatches(actual[own], expected[own])[0]:
        hypothesis = Hypothesis("reference", "the reference's arithmetic")
        inherited = Rerun(stage, g, inputs, upstream, target).trial(hypothesis)
        if inherited.reproduces:
            explanation.verdict = INHERITED
            explanation.note = (f"the same launch computed {own} itself and it diverged; from the device's {own} "
                                "the reference's arithmetic reproduces this stage bit for bit")
            explanation.trials = [inherited]
            return explanation
    # the reference's own arithmetic on what this stage read: the device's upstream where its launch computed it
    computed = inherited is not None and inherited.rejected is None
    explanation.baseline = inherited.mismatches if computed else mismatches(expected[stage], target)[0]
    explanation.claims, explanation.values = value_classes(expected[stage], target)
    if inherited is not None:  # the launch's own upstream diverged: not all of this need be this stage's
        # candidate ids are read off the scores, not written: a column the read-back places as one candidate may
        # hold another (a dense window shortened moves the records into the dense columns)
        read = (f" (as the runner read it back off the scores: the kernel writes no candidate ids, so a column read "
                f"as one candidate may hold another)" if own == "candidate_assembly" else "")
        after = (f"from the device's {own}{read} the reference's arithmetic leaves {inherited.mismatches:,} of this "
                 f"stage's elements unlike the device" if computed else
                 f"from the device's {own}{read} the reference computes no {stage}: {_refusal(inherited.rejected)}")
        explanation.claims.insert(0, Claim(
            f"the same launch computed {own} itself and it diverged too: {after}", OBSERVATION,
            max(inherited.mismatches, 0),
            {"upstream": own, "unlike_device": inherited.mismatches if computed else None}))
    explanation.diagnosis = diagnose_stage(stage, g, inputs, expected, target, upstream)
    held = earlier_sub_step(stage, g, inputs, upstream, expected[stage], target)
    if held is not None:  # a fact about the bytes that no numeric ingredient makes: it leads
        explanation.diagnosis.insert(0, held)
    explanation.first = _first_element(stage, diffs, g, inputs, expected)
    if inherited is not None and not computed:
        # the reference rejects what this launch computed upstream: a variant that reproduces the device there
        # may do so only by accepting those inputs (the sink in the maximum keeps a row of masked candidates
        # finite), which says nothing of the kernel's arithmetic
        explanation.note = (f"no hypothesis is tried: from the device's {own} the reference rejects this stage's "
                            "inputs, and a variant that accepts them is no evidence")
        return explanation
    if any(finding.decisive and finding.kind in STRUCTURAL and finding.evidence.get("structural", True)
           for finding in explanation.diagnosis):
        if stage not in SUB_STEPS:  # the pattern says where values went; the step ported another way may say why
            reruns = sub_step_trials(stage, g, inputs, upstream, target)
            explanation.trials = [trial for _, trial in reruns]
            _decide(explanation, [pair for pair in reruns if pair[1].reproduces], None, witnesses, g.ratio)
        return explanation
    carry = unwritten_state(stage, explanation.tensors(), explanation.baseline, g, inputs, upstream, target)
    if carry is not None:
        explanation.diagnosis.insert(0, carry)
        return explanation
    localized = localize(stage, g, inputs, expected[stage], target)
    skip: tuple[str, ...] = ()
    if localized is not None:  # where it starts; the re-runs and the numeric search below may still name why
        explanation.diagnosis.insert(0, localized)
        if localized.decisive and localized.evidence["structural"]:
            # the values moved far, so that sub-step ported another way is tried first; the fit is within bounds,
            # no proof that no numeric ingredient made it (subnormals flushed in a row of tiny values move it as
            # far), so the numeric search still runs where no such re-run reproduces
            skip = tuple(step for step in SUB_STEPS.get(stage, ()) if step not in localized.evidence["consistent"])
        elif localized.decisive and localized.evidence["rule"] == "none":
            # with nothing matched only a transform (the Hadamard) or a pool done another way moves values so far
            skip = tuple(step for step in SUB_STEPS.get(stage, ()) if step not in ("pool", "Hadamard"))
    rope_exact = localized is not None and localized.evidence["rope_exact"]
    if rope_exact:
        explanation.skipped["RoPE ingredients"] = (
            "every differing record keeps the reference's RoPE tail bit for bit: powf, sinf, cosf and the a*b±c*d "
            "contractions act only there")
    reruns = sub_step_trials(stage, g, inputs, upstream, target, skip=skip + (("RoPE",) if rope_exact else ()))
    explanation.trials = [trial for _, trial in reruns]
    reproduced = any(trial.reproduces for _, trial in reruns)
    found, closest, trials, explanation.search = search(Rerun(stage, g, inputs, upstream, target), device_libm,
                                                        explanation.baseline, rope_exact, combine=not reproduced)
    explanation.trials += trials
    explanation.closest = closest
    _decide(explanation, [pair for pair in reruns if pair[1].reproduces] + found, localized, witnesses, g.ratio)
    if explanation.verdict == UNEXPLAINED:
        _read_layouts(explanation, g, inputs, upstream, target, witnesses)
    if explanation.verdict == UNEXPLAINED and not trials:
        explanation.note = "an integer stage: no arithmetic ingredient to swap"
        if not explanation.diagnosis and explanation.baseline < MIN_SUPPORT:
            explanation.note += (f"; {explanation.baseline} differing element{'s' if explanation.baseline != 1 else ''}"
                                 f": fewer than the {MIN_SUPPORT} a pattern is claimed on")
        elif not explanation.diagnosis:
            explanation.note += f"; no pattern beats chance on its {explanation.baseline:,} differing elements"
    return explanation


def _read_layouts(explanation: Explanation, g, inputs, upstream, target, witnesses: Witnesses | None) -> None:
    """Nothing else reproduced: one input read in another layout (two leading axes exchanged), or without its
    offset along one axis (every row reads row 0's data), may. Every reading that reproduces is re-run first on
    the conformant steps of the same kernel, reading their inputs the same way: however many elements it
    reproduces, a row 0 that holds what the kernel computed for another reason (a carry slot cleared like the
    ones the kernel wrongly cleared) makes a reading reproduce by coincidence, and a step where the device
    read its data right refutes it."""
    reruns = [(*rerun, layout_finding) for rerun in layout_trials(explanation.stage, g, inputs, upstream, target)]
    reruns += [(*rerun, offset_finding) for rerun in offset_trials(explanation.stage, g, inputs, upstream, target)]
    explanation.trials += [trial for _, trial, _, _ in reruns]
    reproducing = [rerun for rerun in reruns if rerun[1].reproduces]
    explanation.hypotheses.update((rerun[1].key, rerun[0]) for rerun in reproducing)
    if witnesses is not None and reproducing:
        explanation.experiments = witnesses.run(explanation.stage, g.ratio, [rerun[0] for rerun in reproducing])
        explanation.refuted = refuted(explanation.experiments)
        reproducing = [rerun for rerun in reproducing if rerun[1].key not in explanation.refuted]
        if not reproducing:
            explanation.note = ("every reading that reproduces it is refuted by the device on a conformant step of "
                                "this kernel: " + "; ".join(f"{key} on {e['case']} step {e['step']}"
                                                            for key, e in explanation.refuted.items()))
    if len(reproducing) > 1:
        explanation.verdict, explanation.rivals = AMBIGUOUS, [trial for _, trial, _, _ in reproducing]
    elif reproducing:
        _, trial, evidence, finding = reproducing[0]
        explanation.verdict, explanation.cause, explanation.rivals = EXPLAINED, trial, [trial]
        explanation.diagnosis.insert(0, finding(explanation.stage, explanation.tensors(), explanation.baseline, trial,
                                                evidence))


def explain_case(golden: GoldenFile, case: str, kernels: KernelDirectory, force_host: frozenset[str] = frozenset(),
                 stages: Sequence[str] = STAGE_NAMES, ulp: int = 0, experiments: bool = True) -> list[Explanation]:
    """Every divergence of one case, the case a run of its own."""
    return explain_cases(golden, [case], kernels, force_host, stages, ulp, experiments)


def explain_cases(golden: GoldenFile, cases: Sequence[str], kernels: KernelDirectory,
                  force_host: frozenset[str] = frozenset(), stages: Sequence[str] = STAGE_NAMES, ulp: int = 0,
                  experiments: bool = True) -> list[Explanation]:
    """Every divergence of the cases as one run: each case's chained verdicts, localized and explained on an
    isolated replay, then settled across all of their divergent steps."""
    chained_runner = DeviceRunner(kernels, mode=Mode.CHAINED, force_host=force_host)
    isolated_runner = DeviceRunner(kernels, mode=Mode.ISOLATED, force_host=force_host)
    explanations = []
    for case in cases:
        chained = check_case(golden, case, chained_runner, stages, ulp, diagnose=stage_findings)
        explanations += explain_report(golden, chained, isolated_runner, stages, ulp, experiments=experiments)
    settle_across_steps(explanations)
    return explanations


def _refusal(message: str) -> str:
    """The reference's rejection as a reader of a headline needs it: what it refuses, without the operator's
    prefix every one of its messages carries."""
    unsupported = operator_message("", "unsupported")
    if message.startswith(unsupported):
        return f"it does not support those inputs ({message[len(unsupported):]})"
    return f"it rejects those inputs ({message.removeprefix(operator_message(''))})"


def failure_note(error: BaseException) -> str:
    """An internal error as one line that names it as csa-conform's own."""
    return str(InternalError.of(error))


# A fit's sub-step whose arithmetic the probes observe under other names: a quantization by its block scales and
# codes (what is left, the packing, each probed stage's claim names as unobserved), the rows streamed into the
# carry by the pool that reads them.
OBSERVED_THROUGH = {"FP8 block quantization": ("FP8 block scale", "FP8 codes"),
                    "FP4 block quantization": ("FP4 block scale", "FP4 codes"),
                    "FP4 round trip": ("FP4 block scale", "FP4 codes"), STREAMED: ("pool",)}


def _probed(explanation: Explanation, claim: Claim | None) -> None:
    """A probe's claim in the explanation: an unexplained divergence's first divergent sub-step observed (exactly,
    or with the unobserved ones before it that it may start at, all named) replaces what the final bytes were
    only consistent with (a fit, or nothing, leading the diagnosis); a fit whose every sub-step the probes saw
    equal is dropped; any other probe claim, or one beside a stronger finding (a transform), is added after the
    lead."""
    if claim is None:
        return
    equal = set(claim.detail.get("equal", ()))
    equal |= {step for step, probes in OBSERVED_THROUGH.items() if equal >= set(probes)}
    if equal:  # a fit whose every consistent sub-step a probe saw bit-exact is refuted by it
        explanation.diagnosis = [finding for finding in explanation.diagnosis if not (
            finding.established_by == FIT and set(finding.evidence.get("consistent", ())) <= equal)]
    if "sub_step" in claim.detail:
        explanation.diagnosis = [finding for finding in explanation.diagnosis
                                 if not _refuted_by_probe(finding, claim.detail["sub_step"])]
    explanation.claims.append(claim)
    _probe_leads(explanation)


def _probe_leads(explanation: Explanation) -> None:
    """An unexplained divergence led by a fit (or by nothing) whose probes observed the first divergent sub-step:
    the observation leads in the fit's place. Also once a cause is dropped (the run's other steps refuted it)."""
    claim = next((claim for claim in explanation.claims if claim.source == PROBE and "sub_step" in claim.detail), None)
    lead = explanation.diagnosis[0] if explanation.diagnosis else None
    if claim is None or explanation.verdict != UNEXPLAINED or (lead is not None and lead.established_by != FIT):
        return
    observed = Finding(SUB_STEP, explanation.stage, "", claim.text, claim.support, claim.support,
                       {"sub_step": claim.detail["sub_step"], "exact": claim.detail["exact"],
                        "support": claim.support}, source=PROBE)
    explanation.diagnosis = [observed] + [finding for finding in explanation.diagnosis
                                          if finding.established_by != FIT]
    explanation.claims.remove(claim)


# What a quantizer's own sub-steps are: where an exponent off by a step shows first.
QUANTIZER_SUB_STEPS = ("FP8 block scale", "FP8 codes", "FP4 block scale", "FP4 codes")


def _refuted_by_probe(finding: Finding, sub_step: str) -> bool:
    """A finding that the device computed the reference's values and only misplaced them (a permutation, two
    axes exchanged) or quantized the reference's block inputs at another exponent, where a probe saw a sub-step
    before the quantizer hold other values: the bytes may still fit the transform, but it is not what went
    wrong. The quantizer's own block scale and codes are where a moved exponent or a nibble order shows."""
    return finding.kind in (PERMUTATION, LAYOUT, SCALE_EXPONENT) and sub_step not in QUANTIZER_SUB_STEPS


def _observe(explanations: Sequence[Explanation], runner: DeviceRunner, info, step, outcome, g: StepGeometry,
             failing, ulp: int) -> None:
    """The device experiments of a case's first divergent step (only there: each re-runs the device): the
    sub-step probes of its stages and the input ablations of each divergence. A failure is that
    experiment's note, never the explanation's verdict."""
    own = [explanation for explanation in explanations if explanation.verdict not in (FAILED, INHERITED)]
    try:
        observations = probe_step(runner, info.attrs, info.output_names, step.inputs, outcome.expected,
                                  outcome.actual.stages, g, [explanation.stage for explanation in own],
                                  case=explanations[0].case if explanations else "", step=outcome.index)
    except Exception as error:  # noqa: BLE001 - a bug of csa-conform or a probe build that fails: said so
        observations = {explanation.stage: {"error": failure_note(error)} for explanation in own
                        if explanation.stage in PROBED}
    for explanation in own:
        explanation.probe = observations.get(explanation.stage)
        _probed(explanation, probe_claim(explanation.probe))
        diffs = [diff for diff in failing if diff.stage == explanation.stage]
        variants: list = []
        try:
            explanation.ablations = ablate(info.attrs, info.output_names, step.inputs, explanation.stage, diffs,
                                           ablation_runner(runner, g.ratio, [explanation.stage]), ulp, variants)
            _held_to_ablations(explanation, variants)
        except Exception as error:  # noqa: BLE001 - as above
            explanation.ablations = [{"key": "failed", "change": "every ablation", "outcome": NOT_RUN,
                                      "reason": failure_note(error)}]
        explanation.claims.extend(filter(None, [ablation_claim(explanation.ablations, explanation.baseline)]))


def _held_to_ablations(explanation: Explanation, variants) -> None:
    """The cause (and its equal variants) or the rivals re-run on the ablated steps the device ran: one that
    leaves any element there unlike the device is dropped, as a conformant step of the kernel would drop it,
    with the sentence that says which input refuted it; an ambiguous verdict left one rival explains, none left
    (or no variant of a cause), the divergence is unexplained."""
    if explanation.verdict not in (EXPLAINED, AMBIGUOUS) or not variants:
        return
    hypotheses = [explanation.hypotheses[trial.key] for trial in explanation.rivals
                  if trial.key in explanation.hypotheses]
    experiments = on_ablations(explanation.stage, explanation.case, explanation.step, variants, hypotheses)
    explanation.experiments += experiments
    gone = {}
    for experiment in experiments:
        for key, unlike in experiment["unlike_device"].items():
            if unlike and key not in gone and key not in explanation.refuted:
                gone[key] = explanation.refuted[key] = experiment
    if not gone:
        return
    dropped = [trial for trial in explanation.rivals if trial.key in gone]
    explanation.claims.extend(Claim(
        f"{trial.name} reproduces this step bit for bit, but re-run on it with {gone[trial.key]['change']} it leaves "
        f"{gone[trial.key]['unlike_device'][trial.key]:,} elements unlike the device there, so it is not claimed as "
        "the cause", RERUN, gone[trial.key]["unlike_device"][trial.key],
        {"ablation": gone[trial.key]["ablation"], "trial": trial.key}) for trial in dropped)
    _drop_rivals(explanation, dropped, lambda key: key in explanation.hypotheses
                 and bool(explanation.hypotheses[key].sub_step))


def explain_report(golden: GoldenFile, chained: CaseVerdict, runner: DeviceRunner, stages: Sequence[str] = STAGE_NAMES,
                   ulp: int = 0, reports: Sequence[CaseVerdict] = (), experiments: bool = True) -> list[Explanation]:
    """The divergences of a chained run's report, localized and explained on ``runner``'s isolated replay.

    An explanation that raises is a ``failed`` verdict for that divergence; the others are kept. A replay
    that fails leaves each of the chained run's divergences not yet explained ``failed`` with its error.
    ``reports`` are the run's other chained reports: its conformant cases are the experiments
    (csa_conform.explain.experiments) that separate rival hypotheses. ``experiments``: probe and ablate the
    case's first divergent step on the device (csa_conform.explain.probes, csa_conform.explain.ablation).
    """
    kernel_of = runner.kernel_of  # noqa: F811 - a provider's stages are named by its methods
    witnesses = Witnesses(golden, reports)
    case = chained.case
    info = golden.case_info(case)
    explanations: list[Explanation] = []
    libm = None
    skipped: dict[str, str] = {}
    observed = False
    try:
        for outcome in replay(golden, case, runner):
            if outcome.actual is None:
                continue
            failing = [diff for diff in compare_step(outcome, stages, ulp) if not diff.passed]
            if not failing:
                continue
            if libm is None and not skipped:
                libm, reason = probe_device_libm(runner)
                if reason:
                    skipped = {"device libm": reason}
            step = golden.read_step(case, outcome.index)
            g = validate_step(info.attrs, step.inputs, info.output_names)
            first = len(explanations)
            for stage in STAGE_NAMES:
                diffs = [diff for diff in failing if diff.stage == stage]
                if not diffs:
                    continue
                try:
                    explained = explain_step(Divergence(case, outcome.index, stage, g, step.inputs,
                                                        outcome.expected, outcome.actual.stages, diffs),
                                             libm, skipped, witnesses)
                    explained.kernel = kernel_of(stage, g.ratio, [diff.tensor for diff in diffs])
                    explanations.append(explained)
                except Exception as error:  # noqa: BLE001 - a bug of csa-conform: this divergence's verdict says so
                    explanations.append(Explanation(
                        case, outcome.index, stage, FAILED, [diff.summary() for diff in diffs],
                        note=failure_note(error), kernel=kernel_of(stage, g.ratio, [diff.tensor for diff in diffs])))
            if not observed and experiments:
                observed = True
                _observe(explanations[first:], runner, info, step, outcome, g, failing, ulp)
    except Exception as error:  # noqa: BLE001 - the replay itself failed: every divergence left says so
        note = failure_note(error)
        done = {(explanation.step, explanation.stage) for explanation in explanations}
        for verdict in chained.diverged():
            step = verdict.step if verdict.step is not None else -1
            if (step, verdict.stage) not in done:
                explanations.append(Explanation(
                    case, step, verdict.stage, FAILED, [diff.summary() for diff in verdict.diffs], note=note,
                    kernel=kernel_of(verdict.stage, chained.ratio, [diff.tensor for diff in verdict.diffs])))
        return explanations
    localized = {explanation.stage for explanation in explanations}
    for verdict in chained.diverged():
        if verdict.stage not in localized:
            explanations.append(Explanation(
                case, verdict.step if verdict.step is not None else -1, verdict.stage, INHERITED,
                [diff.summary() for diff in verdict.diffs],
                note="diverges only chained: the isolated re-run, on the oracle's inputs, is bit-exact, so the "
                     "difference comes from device stages upstream or from earlier steps",
                kernel=kernel_of(verdict.stage, chained.ratio, [diff.tensor for diff in verdict.diffs])))
    settle_across_steps(explanations, final=False)  # the run's other cases may still confirm a cause
    return explanations
