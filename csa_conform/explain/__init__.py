"""`explain`: the cause of every divergence a device run shows.

Each divergent (case, step, stage) is first localized: the case is replayed
isolated, so a stage is judged on the oracle's inputs and upstream noise is
excluded (a stage that diverges only chained inherits it). For each isolated
divergence the pattern of the difference is diagnosed first
(csa_conform.explain.patterns: shifts, restrictions, never-written memory,
permutations, scale exponents, constant factors); a structural pattern no
numeric ingredient can produce ends there. Otherwise the stage is re-run on
the host with the inputs the kernel read, once per hypothesis
(csa_conform.explain.hypotheses), and a hypothesis explains it when it
reproduces the device payload bit for bit. Singles are tried first, in
order, and the first that reproduces ends the search; then combinations of
two, three and four distinct ingredients among those that moved the result,
at most COMBINATION_CAP of them, or STALLED_CAP when no single came closer
than the reference's own arithmetic (the document says when a cap was hit),
and the smallest reproducing one is reported; ``closest`` is
only a hypothesis that left fewer elements differing than the reference's own
arithmetic. Hypotheses are screened on the rows that differ
(csa_conform.explain.rows: attention's query rows), and the cause and the
closest trial are re-run on the whole stage. Every verdict names the kernel (module and entry) that wrote the
stage, and the first divergent element gets its provenance
(csa_conform.explain.element).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from csa_conform.check.conformance import CaseReport, check_case, compare_step, replay
from csa_conform.compare.bitwise import default_axes
from csa_conform.contract import validate_step
from csa_conform.device.kernels import KernelDirectory
from csa_conform.device.launches import kernel_of
from csa_conform.device.runner import DeviceRunner
from csa_conform.errors import ContractError, DeviceUnavailable
from csa_conform.explain.element import element_provenance
from csa_conform.explain.hypotheses import (
    SUB_STEPS,
    Hypothesis,
    stage_hypotheses,
    structural_hypotheses,
)
from csa_conform.explain.patterns import (
    NEVER_WRITTEN,
    ROUNDING_CONVENTION,
    STRUCTURAL,
    SUB_STEP,
    Context,
    Finding,
    diagnose,
    stage_findings,
)
from csa_conform.explain.patterns.substeps import localize
from csa_conform.explain.rows import Rerun
from csa_conform.explain.stages import UPSTREAM_IN_LAUNCH, consumed_upstream, mismatches, run_stage
from csa_conform.explain.trial import Trial
from csa_conform.golden import GoldenFile
from csa_conform.numerics.variant import PAIR_FUSIONS, Numerics, Tally
from csa_conform.spec import BY_NAME, POISON, STAGE_NAMES, Mode

EXPLAINED = "explained"
UNEXPLAINED = "unexplained"
INHERITED = "inherited"
COMBINED_FROM = 6  # combinations are formed from this many closest ingredients
MOST_COMBINED = 4  # of at most this many ingredients
COMBINATION_CAP = 64  # combinations tried at most per divergence, smallest first
STALLED_CAP = 15  # ... when no single came closer: every pair of the six closest ingredients (untied)
ROPE_LIBM = ("powf", "sinf", "cosf")  # called only in the compressed RoPE
# stages whose first-element provenance reads the oracle's intermediates (FP8/FP4 block inputs)
TRACED_PROVENANCE = ("compression_update", "index_key_update", "index_query_finalize")

__all__ = ["EXPLAINED", "INHERITED", "UNEXPLAINED", "Explanation", "Trial", "explain_case", "explain_report"]


@dataclass
class Explanation:
    """The verdict on one divergent (case, step, stage)."""

    case: str
    step: int
    stage: str
    verdict: str
    summary: list[str] = field(default_factory=list)
    cause: Trial | None = None
    closest: Trial | None = None
    trials: list[Trial] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    first: dict | None = None
    note: str = ""
    diagnosis: list[Finding] = field(default_factory=list)
    kernel: str | None = None
    baseline: int = 0  # elements that differ under the reference's own arithmetic
    search: dict | None = None  # how the numeric search ran: singles, combinations, the cap and whether it was hit

    def headline(self) -> str:
        where = f"{self.case} step {self.step} {self.stage}"
        if self.kernel:
            where += f" [{self.kernel}]"
        if self.verdict == EXPLAINED and self.cause is not None:
            return (f"{where}: explained: {self.cause.name} — {self.cause.effect()}; "
                    f"reproduces {self.tensors()} bit for bit")
        if self.verdict == INHERITED:
            return f"{where}: inherited: {self.note}"
        finding = self.diagnosis[0] if self.diagnosis else None
        if finding is not None and finding.kind in STRUCTURAL and finding.decisive and self.search is None:
            return f"{where}: {finding.kind}: {finding.headline} (structural: no numeric ingredient tried)"
        pattern = f": {finding.kind}: {finding.headline}" if finding is not None else (
            f": {self.note}" if self.note else "")
        return f"{where}: unexplained{pattern} ({self.closest_text()})"

    def closest_text(self) -> str:
        if self.closest is not None:
            return (f"closest: {self.closest.name} reduces the differing elements from {self.baseline:,} to "
                    f"{self.closest.mismatches:,} of {self.closest.elements:,}")
        if any(trial.rejected is None for trial in self.trials):
            return "no numeric ingredient moves the result"
        return "no numeric ingredient applies to this stage"

    def tensors(self) -> str:
        return ", ".join(line.split(":", 1)[0].split("/", 1)[-1] for line in self.summary) or "the payload"

    def lines(self) -> list[str]:
        lines = [self.headline()]
        lines.extend(f"  {line}" for line in self.summary)
        for finding in self.diagnosis[1:]:
            lines.append(f"  also {finding.kind}: {finding.headline}")
        for key, reason in self.skipped.items():
            lines.append(f"  skipped {key}: {reason}")
        if self.search and self.search["capped"]:
            lines.append(f"  combination search stopped at its cap of {self.search['cap']} combinations "
                         f"({self.search['untried']:,} more not tried)")
        if self.first:
            lines.append("  first divergent element: " + _describe(self.first))
        return lines

    def to_dict(self) -> dict:
        return {"case": self.case, "step": self.step, "stage": self.stage, "verdict": self.verdict,
                "headline": self.headline(), "divergence": self.summary, "note": self.note,
                "cause": None if self.cause is None else self.cause.to_dict(),
                "closest": None if self.closest is None else self.closest.to_dict(),
                "trials": [trial.to_dict() for trial in self.trials], "skipped": self.skipped,
                "first_element": self.first, "kernel": self.kernel, "baseline": self.baseline,
                "search": self.search, "diagnosis": [finding.to_dict() for finding in self.diagnosis]}


def _value(value) -> str:
    """binary32 values as their shortest binary32 repr, everything else as is."""
    return str(np.float32(value)) if isinstance(value, float) else str(value)


def _describe(first: dict) -> str:
    parts = []
    for key, value in first.items():
        if key == "candidates":
            value = "; ".join(f"{c['kind']} {c['id']} score {_value(c['score'])} weight {_value(c['weight'])}"
                              for c in value)
            parts.append(f"top candidates [{value}]")
        elif key == "block":
            parts.append("block " + ", ".join(f"{k} {_value(v)}" for k, v in value.items()))
        else:
            parts.append(f"{key} {_value(value)}")
    return "; ".join(parts)


def _trial(hypothesis: Hypothesis, stage: str, g, inputs, upstream, target) -> Trial:
    return Rerun(stage, g, inputs, upstream, target).trial(hypothesis)


def _ingredient(hypothesis: Hypothesis) -> str:
    """What a single hypothesis swaps: one libm function, the block scale, a fusion kind, or ftz."""
    if hypothesis.libm:
        return hypothesis.libm[0][0]
    if hypothesis.block_scale is not None:
        return "block scale"
    if hypothesis.fused:
        return "pairs" if hypothesis.fused & set(PAIR_FUSIONS) else "accumulate"
    return "ftz"


def _acts_only_in_rope(hypothesis: Hypothesis) -> bool:
    """powf, sinf, cosf and the pair contractions appear only in the compressed RoPE."""
    if hypothesis.libm:
        return hypothesis.libm[0][0] in ROPE_LIBM
    return bool(hypothesis.fused) and hypothesis.fused <= set(PAIR_FUSIONS)


def _combinations(singles: list[Hypothesis], trials: list[Trial]) -> list[list[Hypothesis]]:
    """Groups of 2..MOST_COMBINED distinct ingredients, smallest first, from the COMBINED_FROM ingredients
    whose best single comes closest; an ingredient contributes each of its variants that tie for best with a
    payload of their own (variants that computed the same payload are one)."""
    best: dict[str, list[tuple[Hypothesis, int]]] = {}
    for hypothesis, trial in zip(singles, trials):
        if trial.rejected is not None or not any(changed for changed, _ in trial.changed.values()):
            continue
        variants = best.setdefault(_ingredient(hypothesis), [])
        if not variants or trial.mismatches < variants[0][1]:
            variants[:] = [(hypothesis, trial.mismatches, trial.digest)]
        elif trial.mismatches == variants[0][1] and all(trial.digest != digest for *_, digest in variants):
            variants.append((hypothesis, trial.mismatches, trial.digest))
    ranked = sorted(best.values(), key=lambda variants: variants[0][1])[:COMBINED_FROM]
    found = []
    for size in range(2, MOST_COMBINED + 1):
        for ingredients in itertools.combinations(ranked, size):
            for choice in itertools.product(*ingredients):
                found.append([hypothesis for hypothesis, *_ in choice])
    return found


def _search(stage: str, g, inputs, upstream, target, device_libm, baseline: int,
            rope_exact: bool = False) -> tuple[Trial | None, Trial | None, list[Trial], dict]:
    """(cause, closest, every trial, how the search ran): singles, then the smallest combinations of the
    closest ingredients (a kernel may swap several at once, e.g. CUDA's powf, sinf and cosf together), at
    most COMBINATION_CAP of them (STALLED_CAP when no single moved the result closer to the device's).
    Trials are screened on the rows that differ; the cause and ``closest`` (the trial with fewest
    mismatches among those with fewer than ``baseline``, the reference's own) are then re-run on the whole
    stage, and a screened cause that does not reproduce there is no cause."""
    rerun = Rerun(stage, g, inputs, upstream, target)
    singles = [hypothesis for hypothesis in stage_hypotheses(stage, device_libm)
               if not (rope_exact and _acts_only_in_rope(hypothesis))]
    trials = []
    for hypothesis in singles:  # the first single that reproduces ends the search
        trials.append(rerun.confirmed(hypothesis, rerun.trial(hypothesis)))
        if trials[-1].reproduces:
            break
    singles = singles[:len(trials)]
    groups = _combinations(singles, trials) if not any(trial.reproduces for trial in trials) else []
    progress = any(trial.rejected is None and trial.mismatches < baseline for trial in trials)
    cap = COMBINATION_CAP if progress else STALLED_CAP
    tried = 0
    for members in groups[:cap]:
        if tried and len(members) > len(groups[tried - 1]) and any(trial.reproduces for trial in trials):
            break  # the smallest reproducing size is complete
        combined = members[0]
        for other in members[1:]:
            combined = combined.combine(other)
        trials.append(rerun.confirmed(combined, rerun.trial(combined)))
        tried += 1
    reproducing = [trial for trial in trials if trial.reproduces]
    search = {"singles": len(singles), "combinations": tried, "cap": cap,
              "capped": tried == cap and len(groups) > cap and not reproducing,
              "untried": len(groups) - tried, "screened_rows": rerun.screened}
    measured = [trial for trial in trials if trial.rejected is None and trial.mismatches < baseline]
    closest = min(measured, key=lambda trial: trial.mismatches) if measured else None
    if closest is not None and rerun.screened is not None:
        closest = rerun.whole(closest)
    cause = min(reproducing, key=lambda trial: sum(changed for changed, _ in trial.changed.values()),
                default=None) if reproducing else None
    return cause, closest, trials, search


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


def explain_step(case: str, step: int, stage: str, g, inputs, expected, actual, diffs,
                 device_libm: Callable[[str], Callable] | None, skipped: dict[str, str]) -> Explanation:
    """Explain one isolated divergence of `stage` (its failing `diffs`)."""
    explanation = Explanation(case, step, stage, UNEXPLAINED, [diff.summary() for diff in diffs],
                              skipped=dict(skipped) if BY_NAME[stage].libm else {},
                              kernel=kernel_of(stage, g.ratio, [diff.tensor for diff in diffs]))
    target = actual[stage]
    upstream = consumed_upstream(stage, expected, actual)
    own = UPSTREAM_IN_LAUNCH.get(stage)
    if own in actual and mismatches(actual[own], expected[own])[0]:
        inherited = _trial(Hypothesis("reference", "the reference's arithmetic"), stage, g, inputs, upstream, target)
        if inherited.reproduces:
            explanation.verdict = INHERITED
            explanation.note = (f"the same launch computed {own} itself and it diverged; from the device's {own} "
                                "the reference's arithmetic reproduces this stage bit for bit")
            explanation.trials = [inherited]
            return explanation
    explanation.baseline = mismatches(expected[stage], target)[0]
    explanation.diagnosis = _diagnose(stage, g, inputs, expected, target, upstream)
    explanation.first = _first_element(stage, diffs, g, inputs, expected)
    if any(finding.decisive and finding.kind in STRUCTURAL for finding in explanation.diagnosis):
        return explanation
    if _unwritten_state(explanation, g, inputs, upstream, target):
        return explanation
    localized = localize(stage, g, inputs, expected[stage], target)
    gross = False
    if localized is not None:  # where it starts; the re-runs and the numeric search below may still name why
        explanation.diagnosis.insert(0, localized)
        if localized.decisive and localized.evidence["structural"]:
            return explanation
        # nothing later matches: no rounding convention or RoPE position moves the values that far
        gross = localized.decisive and localized.evidence["rule"] == "first"
    rope_exact = localized is not None and localized.evidence["rope_exact"]
    if rope_exact:
        explanation.skipped["RoPE ingredients"] = ("every differing record keeps the reference's RoPE tail bit for bit: "
                                                  "powf, sinf, cosf and the a*b±c*d contractions act only there")
    if not gross and _sub_step(explanation, g, inputs, upstream, target, skip=("RoPE",) if rope_exact else ()):
        return explanation
    cause, closest, trials, explanation.search = _search(stage, g, inputs, upstream, target, device_libm,
                                                         explanation.baseline, rope_exact)
    explanation.trials, explanation.closest = trials, closest
    if cause is not None:
        explanation.verdict, explanation.cause = EXPLAINED, cause
    elif not trials:
        explanation.note = "an integer stage: no arithmetic ingredient to swap"
    return explanation


def _unwritten_state(explanation: Explanation, g, inputs, upstream, target) -> bool:
    """A past carry the kernel never copied into its state: the stage re-run with that input replaced by the
    runner's poison (what the kernel's fresh state buffer held) reproduces the device. The records it
    emits were pooled from uninitialised memory, so no numeric ingredient is tried."""
    stage = explanation.stage
    carry = next((name for name in BY_NAME[stage].inputs if name.endswith("_carry")), None)
    if carry is None or g.start == 0:  # at position 0 the reference resets the carry whatever it held
        return False
    poisoned = np.empty(np.shape(inputs[carry]), dtype=np.float32)
    poisoned.view(np.uint8).fill(POISON)
    hypothesis = Hypothesis("state:never-written", f"{carry} never copied into the kernel's state")
    trial = Rerun(stage, g, dict(inputs, **{carry: poisoned}), upstream, target).trial(hypothesis)
    if not trial.reproduces:
        return False
    headline = (f"the kernel never copied {carry} into its state: the stage re-run from the runner's 0x{POISON:02X} "
                f"poison in place of {carry} reproduces the device bit for bit (records pooled from "
                "uninitialised memory)")
    explanation.diagnosis.insert(0, Finding(NEVER_WRITTEN, stage, explanation.tensors(), headline,
                                            explanation.baseline, explanation.baseline,
                                            {"pattern": f"0x{POISON:02X}", "source": carry, "trial": hypothesis.key}))
    return True


def _sub_step(explanation: Explanation, g, inputs, upstream, target, skip: tuple[str, ...] = ()) -> bool:
    """Try each sub-step of the stage done another way (csa_conform.explain.hypotheses.structural_hypotheses);
    one that reproduces the device names the first sub-step that differs, and is the cause."""
    stage = explanation.stage
    for hypothesis in structural_hypotheses(stage, g.ratio):
        if hypothesis.sub_step in skip:
            continue
        trial = _trial(hypothesis, stage, g, inputs, upstream, target)
        explanation.trials.append(trial)
        if not trial.reproduces:
            continue
        explanation.verdict, explanation.cause = EXPLAINED, trial
        order = " → ".join(SUB_STEPS.get(stage, ()))
        evidence = {"sub_step": hypothesis.sub_step, "variant": hypothesis.name, "trial": hypothesis.key,
                    "sub_steps": list(SUB_STEPS.get(stage, ()))}
        if hypothesis.bf16 or hypothesis.code_ties_away:
            kind, headline = ROUNDING_CONVENTION, (f"the kernel's {hypothesis.name}: {trial.effect()}; the re-run "
                                                  "reproduces the device bit for bit")
            evidence["convention"] = hypothesis.name
        else:
            kind, headline = SUB_STEP, (f"the first sub-step that differs is {hypothesis.sub_step} ({order}): "
                                        f"the device's bytes are the reference's with {hypothesis.name}, every "
                                        "other sub-step as the reference does it")
        explanation.diagnosis.insert(0, Finding(kind, stage, explanation.tensors(), headline, explanation.baseline,
                                                explanation.baseline, evidence))
        return True
    return False


def _diagnose(stage: str, g, inputs, expected, target, upstream) -> list[Finding]:
    """The structural findings on the stage's diverged tensors (csa_conform.explain.patterns)."""
    def tracer() -> dict:
        trace: dict = {}
        try:
            run_stage(stage, g, inputs, upstream, Numerics(trace=trace))
        except ContractError:
            return {}
        return trace

    reference = expected[stage]
    axes = {tensor: default_axes(stage, tensor, np.shape(array), np.asarray(array).dtype)
            for tensor, array in reference.items()}
    return diagnose(stage, reference, target, axes, Context(stage, g, inputs, expected, tracer))


def _device_libm(runner: DeviceRunner) -> tuple[Callable[[str], Callable] | None, str | None]:
    """CUDA's libm on this run's device (compiled with the run's build), or why it is unavailable."""
    try:
        backend = runner.backend()
    except DeviceUnavailable as error:
        return None, f"no CUDA device: {error}"
    probe = getattr(backend, "evaluate_libm", None)
    if probe is None:
        return None, (f"{backend.info().name} has no CUDA libm to evaluate; its stand-in for the platform libm "
                      "is correctly rounded, which the correctly-rounded hypotheses cover")
    build = runner.kernels.build

    def function(name: str) -> Callable:
        return lambda *args: probe(name, args, build)
    return function, None


def explain_case(golden: GoldenFile, case: str, kernels: KernelDirectory, force_host: frozenset[str] = frozenset(),
                 stages: Sequence[str] = STAGE_NAMES, ulp: int = 0) -> list[Explanation]:
    """Every divergence of one case: chained verdicts, localized and explained on an isolated replay."""
    chained = check_case(golden, case, DeviceRunner(kernels, mode=Mode.CHAINED, force_host=force_host), stages, ulp,
                         diagnose=stage_findings)
    return explain_report(golden, chained, DeviceRunner(kernels, mode=Mode.ISOLATED, force_host=force_host),
                          stages, ulp)


def explain_report(golden: GoldenFile, chained: CaseReport, runner: DeviceRunner, stages: Sequence[str] = STAGE_NAMES,
                   ulp: int = 0) -> list[Explanation]:
    """The divergences of a chained run's report, localized and explained on ``runner``'s isolated replay."""
    case = chained.case
    info = golden.case_info(case)
    explanations: list[Explanation] = []
    device_libm = None
    skipped: dict[str, str] = {}
    for outcome in replay(golden, case, runner):
        if outcome.actual is None:
            continue
        failing = [diff for diff in compare_step(outcome, stages, ulp) if not diff.passed]
        if not failing:
            continue
        if device_libm is None and not skipped:
            device_libm, reason = _device_libm(runner)
            if reason:
                skipped = {"device libm": reason}
        step = golden.read_step(case, outcome.index)
        g = validate_step(info.attrs, step.inputs, info.output_names)
        for stage in STAGE_NAMES:
            diffs = [diff for diff in failing if diff.stage == stage]
            if diffs:
                explanations.append(explain_step(case, outcome.index, stage, g, step.inputs, outcome.expected,
                                                 outcome.actual.stages, diffs, device_libm, skipped))
    localized = {explanation.stage for explanation in explanations}
    for verdict in chained.diverged():
        if verdict.stage not in localized:
            explanations.append(Explanation(
                case, verdict.step if verdict.step is not None else -1, verdict.stage, INHERITED,
                [diff.summary() for diff in verdict.diffs],
                note="diverges only chained: the isolated re-run, on the oracle's inputs, is bit-exact, so the "
                     "difference comes from device stages upstream or from earlier steps",
                kernel=kernel_of(verdict.stage, chained.ratio, [diff.tensor for diff in verdict.diffs])))
    return explanations

