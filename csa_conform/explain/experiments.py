"""Discriminating experiments the run already did: a case where the device's kernel matched the reference at
a stage is an input on which every true hypothesis about that kernel must predict the reference's bytes.

When rival hypotheses reproduce a divergence (or one reproduces on thin evidence), each is re-run on the
golden inputs of up to WITNESS_CASES cases of the same ratio whose chained run was conformant with that
stage on the device, or whose first steps were conformant before a later one diverged (WITNESS_STEPS steps
each; the case is its own one-case input, already in the golden file). Steps that resume a stream come
first, in the cases and within each: a fresh prefill reads no past carry, cache or window, so it cannot
refute a hypothesis about how a kernel reads its past state. A hypothesis about how the kernel
reads its data (a layout, an offset left out) reads the witness's inputs that way. A hypothesis that
predicts any differing element there is refuted: the device computed the reference's bytes. What survives
is kept; every experiment is reported (case, step, each hypothesis's predicted differing elements, what the
device did: 0 differing). The ablated steps the device ran for a divergence are experiments too: there a
hypothesis must predict the device's own bytes, divergent or not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from csa_conform._base.statuses import IDENTICAL
from csa_conform.check.model import CaseVerdict
from csa_conform.contract import validate_step
from csa_conform.errors import ContractError
from csa_conform.explain.ablation import Variant
from csa_conform.explain.hypotheses import Hypothesis
from csa_conform.explain.stages import judged_tensors, mismatches, run_stage
from csa_conform.golden import GoldenFile
from csa_conform.golden.layout import WINDOW

WITNESS_CASES = 6  # conformant cases a hypothesis is re-run on
WITNESS_STEPS = 2  # steps of each


@dataclass
class Witnesses:
    """The run's conformant cases, as experiments on the kernels that computed them."""

    golden: GoldenFile
    reports: Sequence[CaseVerdict]

    def cases(self, stage: str, ratio: int) -> list[tuple[CaseVerdict, int]]:
        """(report, conformant steps): the conformant cases first (every step), then the steps before a
        divergent case's first divergence, where the chained run, on the reference's inputs, matched every
        stage."""
        whole, leading = [], []
        for report in self.reports:
            verdict = report.stages.get(stage)
            if (report.ratio != ratio or verdict is None or verdict.placement != "device" or report.invalid is not None
                    or report.stopped is not None or report.findings):
                continue
            if report.passed and verdict.status == IDENTICAL:
                whole.append((report, report.step_count))
            elif report.diverged() and all(v.step is not None for v in report.diverged()):
                first = min(v.step for v in report.diverged())
                if first > 0:
                    leading.append((report, first))
        return whole + leading

    def steps(self, stage: str, ratio: int) -> list[tuple[CaseVerdict, list[int]]]:
        """(report, its witness steps) of up to WITNESS_CASES cases, WITNESS_STEPS steps each: steps that resume
        a stream first (a later step, or a first one whose kv window starts past position 0)."""
        chosen = []
        for report, conformant in self.cases(stage, ratio):
            steps = [index for index in range(conformant) if index not in report.rejected_steps]
            steps.sort(key=lambda index: not self._resumes(report.case, index))
            if steps:
                chosen.append((report, steps[:WITNESS_STEPS]))
        chosen.sort(key=lambda pair: not self._resumes(pair[0].case, pair[1][0]))
        return chosen[:WITNESS_CASES]

    def _resumes(self, case: str, index: int) -> bool:
        return index > 0 or self.golden.step_attrs(case, index).get(WINDOW, [0])[0] > 0

    def run(self, stage: str, ratio: int, hypotheses: Sequence[Hypothesis]) -> list[dict]:
        """One experiment per (witness case, step): what each hypothesis predicts there, and the device's 0."""
        experiments = []
        for report, steps in self.steps(stage, ratio):
            info = self.golden.case_info(report.case)
            for index in sorted(steps):
                step = self.golden.read_step(report.case, index)
                g = validate_step(info.attrs, step.inputs, info.output_names)
                if stage not in step.stages:
                    continue
                predicted = {}
                for hypothesis in hypotheses:
                    payload = replay(stage, g, step.inputs, step.stages, hypothesis)
                    if payload is not None:
                        predicted[hypothesis.key] = mismatches(payload, step.stages[stage])[0]
                experiments.append({"case": report.case, "step": index, "predicted_differing": predicted,
                                    "device_differing": 0})
        return experiments


def replay(stage: str, g, inputs, upstream, hypothesis: Hypothesis):
    """The hypothesis's payload of ``stage`` on another step (its inputs read the hypothesis's way), or None where
    that step tests nothing: it holds nothing the reading reads, or the reference rejects it."""
    if hypothesis.reading is not None:  # the kernel read that step's data the same wrong way
        read = hypothesis.reading(inputs, upstream)
        if read is None:
            return None
        inputs, upstream = read
    try:
        return run_stage(stage, g, inputs, upstream, hypothesis.numerics())
    except ContractError:
        return None


def on_ablations(stage: str, case: str, step: int, variants: Sequence[Variant],
                 hypotheses: Sequence[Hypothesis]) -> list[dict]:
    """The hypotheses re-run on the ablated steps the device ran: an input that changed, a step the device
    computed (the reference's bytes where the divergence vanished, its own where it persisted). A true cause
    predicts the device's bytes there as well; one that leaves any element unlike them is refuted, and one that
    reproduces a step where the divergence persisted is reproduced again on another input."""
    experiments = []
    for variant in variants:
        unlike = {}
        device, oracle = variant.actual[stage], variant.expected[stage]
        # an ablated step runs isolated: a copy another launch made of the oracle's tensor says nothing of this one
        judged = judged_tensors(stage, device, {name for name, array in device.items()
                                                if mismatches({name: oracle[name]}, {name: array})[0]})
        for hypothesis in hypotheses:
            payload = replay(stage, variant.g, variant.inputs, variant.expected, hypothesis)
            if payload is not None:
                unlike[hypothesis.key] = mismatches(payload, judged)[0]
        if unlike:
            experiments.append({"case": case, "step": step, "ablation": variant.key, "change": variant.change,
                                "predicted_differing": {}, "device_differing": variant.differing,
                                "unlike_device": unlike})
    return experiments


def refuted(experiments: list[dict]) -> dict[str, dict]:
    """Hypothesis key -> the first experiment that refutes it (it predicted a difference the device did not make)."""
    found: dict[str, dict] = {}
    for experiment in experiments:
        for key, differing in experiment["predicted_differing"].items():
            if differing and key not in found:
                found[key] = experiment
    return found
