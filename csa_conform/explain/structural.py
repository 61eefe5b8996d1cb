"""Structural pre-checks of a divergence, before any numeric ingredient: the pattern detectors
(csa_conform.explain.patterns), a past carry the kernel never copied, and the sub-step re-runs (a bf16 or code
rounding convention, RoPE at another position or pair layout), every one of them tried; and, when nothing
else reproduces, an input read in another layout or without its offset along an axis."""

from __future__ import annotations

from collections import ChainMap
from functools import partial
from typing import Callable

import numpy as np

from csa_conform.compare.bitwise import default_axes
from csa_conform.errors import ContractError
from csa_conform.explain.claims import RERUN
from csa_conform.explain.hypotheses import SUB_STEPS, Hypothesis, structural_hypotheses
from csa_conform.explain.patterns import (
    LAYOUT,
    NEVER_WRITTEN,
    ROUNDING_CONVENTION,
    ROW_ALIASING,
    SUB_STEP,
    Context,
    Finding,
    diagnose,
)
from csa_conform.explain.rows import Rerun
from csa_conform.explain.stages import UPSTREAM_IN_LAUNCH, run_stage
from csa_conform.explain.trial import Trial
from csa_conform.numerics.variant import Numerics
from csa_conform.spec import BY_NAME, POISON


def diagnose_stage(stage: str, g, inputs, expected, target, upstream) -> list[Finding]:
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


def unwritten_state(stage: str, tensors: str, baseline: int, g, inputs, upstream, target) -> Finding | None:
    """A past carry the kernel never copied into its state: the stage re-run with that input replaced by the
    runner's poison (what the kernel's fresh state buffer held) reproduces the device. The records it
    emits were pooled from uninitialised memory, so no numeric ingredient is tried."""
    carry = next((name for name in BY_NAME[stage].inputs if name.endswith("_carry")), None)
    if carry is None or g.start == 0:  # at position 0 the reference resets the carry whatever it held
        return None
    poisoned = np.empty(np.shape(inputs[carry]), dtype=np.float32)
    poisoned.view(np.uint8).fill(POISON)
    hypothesis = Hypothesis("state:never-written", f"{carry} never copied into the kernel's state")
    trial = Rerun(stage, g, dict(inputs, **{carry: poisoned}), upstream, target).trial(hypothesis)
    if not trial.reproduces:
        return None
    headline = (f"the kernel never copied {carry} into its state: the stage re-run from the runner's 0x{POISON:02X} "
                f"poison in place of {carry} reproduces the device bit for bit (records pooled from "
                "uninitialised memory)")
    return Finding(NEVER_WRITTEN, stage, tensors, headline, baseline, baseline,
                   {"pattern": f"0x{POISON:02X}", "source": carry, "trial": hypothesis.key}, RERUN)


def sub_step_trials(stage: str, g, inputs, upstream, target,
                    skip: tuple[str, ...] = ()) -> list[tuple[Hypothesis, Trial]]:
    """Every sub-step of the stage done another way (csa_conform.explain.hypotheses.structural_hypotheses),
    each re-run: all of them, so a rival that also reproduces is seen."""
    rerun = Rerun(stage, g, inputs, upstream, target)
    return [(hypothesis, rerun.trial(hypothesis)) for hypothesis in structural_hypotheses(stage, g.ratio)
            if hypothesis.sub_step not in skip]


def sub_step_finding(stage: str, tensors: str, baseline: int, hypothesis: Hypothesis, trial: Trial,
                     localized: Finding | None) -> Finding:
    """What a reproducing sub-step re-run names: a rounding convention or the first sub-step that differs,
    with its support and whether the sub-step localization of the same tensor agrees."""
    order = " → ".join(SUB_STEPS.get(stage, ()))
    evidence = {"sub_step": hypothesis.sub_step, "variant": hypothesis.name, "trial": hypothesis.key,
                "sub_steps": list(SUB_STEPS.get(stage, ())), "support": trial.support}
    if hypothesis.bf16 or hypothesis.code_ties_away:
        kind, headline = ROUNDING_CONVENTION, (f"the kernel's {hypothesis.name}: {trial.effect()}; the re-run "
                                              "reproduces the device bit for bit")
        evidence["convention"] = hypothesis.name
    else:
        kind, headline = SUB_STEP, (f"the first sub-step that differs is {hypothesis.sub_step} ({order}): "
                                    f"the device's bytes are the reference's with {hypothesis.name}, every "
                                    "other sub-step as the reference does it")
    located = localized.evidence.get("consistent") if localized is not None else None
    if located:
        evidence["localized"] = located
        if hypothesis.sub_step not in located and not hypothesis.bf16:
            headline += (f"; the intermediates fit only {', '.join(located)} within rounding bounds (a fit, the "
                         "re-run is bit for bit)")
    return Finding(kind, stage, tensors, headline, baseline, baseline, evidence, RERUN)


def read_as(array: np.ndarray, first: int, second: int) -> np.ndarray:
    """What a kernel reads from ``array``'s bytes when it indexes them with axes ``first`` and ``second``
    exchanged in memory (the layout of another contract; negative axes count from the right)."""
    shape = list(array.shape)
    shape[first], shape[second] = shape[second], shape[first]
    return np.ascontiguousarray(np.ascontiguousarray(array).reshape(shape).swapaxes(first, second))


# Inputs of a rank that varies by case, broadcast right-aligned to these axes.
RIGHT_ALIGNED = {"attention_bias": ("B", "N", "S", "C")}


def layout_trials(stage: str, g, inputs, upstream, target) -> list[tuple[Hypothesis, Trial, dict]]:
    """The stage re-run with one input read in another layout: two of its leading axes (both longer than
    one) exchanged in memory. Each is a hypothesis of its own; what reproduces names the input and axes. The
    axes are counted from the right and named in the full layout (RIGHT_ALIGNED), so one reading means the
    same on a conformant step whose bias has another rank (a [N, S, C] bias's axes 0 and 1 are [B, N, S, C]'s
    axes 1 and 2 there)."""
    found = []
    for name in BY_NAME[stage].inputs:
        array = inputs.get(name)
        if array is None or np.ndim(array) < 3:
            continue
        array = np.asarray(array)
        axes = RIGHT_ALIGNED.get(name)
        offset = len(axes) - array.ndim if axes else 0
        for first, second in ((0, 1), (1, 2), (0, 2)):
            if second >= array.ndim - 1 or array.shape[first] < 2 or array.shape[second] < 2:
                continue
            named = (first + offset, second + offset)
            which = (f"its {axes[named[0]]} and {axes[named[1]]} axes" if axes
                     else f"its axes {named[0]} and {named[1]}")
            hypothesis = Hypothesis(f"layout:{name}:{named[0]}{named[1]}",
                                    f"{name} read with {which} exchanged in memory",
                                    reading=_input_read(name, partial(read_as, first=first - array.ndim,
                                                                      second=second - array.ndim),
                                                        lambda other, rank=array.ndim - first: other.ndim >= rank))
            trial = Rerun(stage, g, *hypothesis.reading(inputs, upstream), target).trial(hypothesis)
            found.append((hypothesis, trial, {"input": name, "axes": list(named), "shape": list(array.shape)}))
    return found


def _input_read(name: str, read: Callable, fits: Callable[[np.ndarray], bool]) -> Callable:
    """A reading: (inputs, upstream) with input ``name`` as ``read`` makes of it; None on a step whose inputs
    cannot show it (no such input, or one without the axes it reads: ``fits`` says)."""
    def reading(inputs, upstream):
        array = np.asarray(inputs[name]) if name in inputs else None
        if array is None or not fits(array):
            return None
        return dict(inputs, **{name: read(array)}), upstream
    return reading


def _upstream_read(source: str, name: str, read: Callable, fits: Callable[[np.ndarray], bool]) -> Callable:
    """A reading: (inputs, upstream) with stage ``source``'s tensor ``name`` as ``read`` makes of it; None on a
    step without that tensor (a stage's payload has one rank everywhere)."""
    def reading(inputs, upstream):
        payload = upstream.get(source)
        if payload is None or name not in payload:
            return None
        return inputs, dict(upstream, **{source: ChainMap({name: read(np.asarray(payload[name]))}, payload)})
    return reading


def without_offset(array: np.ndarray, axis: int) -> np.ndarray:
    """What a kernel reads from ``array`` when it leaves the offset along ``axis`` out: index 0's data."""
    return np.ascontiguousarray(np.broadcast_to(np.take(array, [0], axis=axis), array.shape))


def offset_trials(stage: str, g, inputs, upstream, target) -> list[tuple[Hypothesis, Trial, dict]]:
    """The stage re-run with one input read without its offset along one leading axis (longer than one), or
    one tensor of an earlier launch's payload without its batch offset: every index of that axis reads index
    0's data, a batch or head offset left out of the address. Each is a hypothesis of its own; what reproduces
    names the tensor and the axis."""
    read = [(name, np.asarray(inputs[name]), range(max(1, np.ndim(inputs[name]) - 1)), partial(_input_read, name))
            for name in BY_NAME[stage].inputs if name in inputs and np.ndim(inputs[name])]
    own = UPSTREAM_IN_LAUNCH.get(stage)
    for source in BY_NAME[stage].reads:
        if source == own or source not in upstream:
            continue
        for name in upstream[source]:
            if np.ndim(upstream[source][name]) >= 2:
                read.append((name, np.asarray(upstream[source][name]), range(1), partial(_upstream_read, source, name)))
    found = []
    for name, array, axes, reader in read:
        for axis in axes:
            if array.shape[axis] < 2:
                continue
            hypothesis = Hypothesis(f"offset:{name}:{axis}", f"{name} read without its offset along axis {axis}",
                                    reading=reader(partial(without_offset, axis=axis),
                                                   lambda other, rank=array.ndim: other.ndim == rank))
            trial = Rerun(stage, g, *hypothesis.reading(inputs, upstream), target).trial(hypothesis)
            found.append((hypothesis, trial, {"input": name, "axis": axis, "shape": list(array.shape)}))
    return found


def offset_finding(stage: str, tensors: str, baseline: int, trial: Trial, evidence: dict) -> Finding:
    """A read without an offset that reproduces the device bit for bit: every row reads row 0's data."""
    headline = (f"the kernel reads {evidence['input']} (shape {tuple(evidence['shape'])}) without its offset along "
                f"axis {evidence['axis']}: every index there reads index 0's data, and the stage re-run from that "
                "reading reproduces the device bit for bit")
    return Finding(ROW_ALIASING, stage, tensors, headline, baseline, baseline,
                   dict(evidence, trial=trial.key, support=trial.support, read=True), RERUN)


def layout_finding(stage: str, tensors: str, baseline: int, trial: Trial, evidence: dict) -> Finding:
    """A read in another layout that reproduces the device bit for bit."""
    first, second = evidence["axes"]
    axes = RIGHT_ALIGNED.get(evidence["input"])
    which = f"its {axes[first]} and {axes[second]} axes" if axes else f"axes {first} and {second}"
    headline = (f"the kernel reads {evidence['input']} (shape {tuple(evidence['shape'])}) with {which} "
                "exchanged: the stage re-run from that reading reproduces the device bit for bit")
    return Finding(LAYOUT, stage, tensors, headline, baseline, baseline,
                   dict(evidence, trial=trial.key, support=trial.support), RERUN)
