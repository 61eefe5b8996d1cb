"""Input ablation: which of a divergent step's inputs the divergence needs.

The step is re-run, on the oracle and on the device (isolated, as explain replays it), with one
ingredient neutralised at a time while the contract still accepts the step: the attention bias zero, the
sink's weight zero, the scale one or the contract's default, a compressor's APE zero or norm weight one,
the index weights one, the step restarted at position 0 (a fresh prefill of the same tokens), one batch
row, one head. Each variant
is an experiment whose result is a fact about the kernel: the divergence of the stage vanishes there (it
needs that ingredient) or persists (it does not). The edits are the reducer's (csa_conform.golden.edits),
so every variant is a step the oracle accepts and computes itself; one the contract rejects, or one
that changes nothing (the input is already neutral), is reported as not run, never as a result.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

import numpy as np

from csa_conform.check.conformance import StepOutcome, compare_step
from csa_conform.contract import StepGeometry, validate_step
from csa_conform.device.runner import DeviceRunner
from csa_conform.errors import ContractError, HostStageRejected
from csa_conform.explain.claims import ABLATION, Claim
from csa_conform.explain.patterns.findings import MIN_SUPPORT
from csa_conform.explain.stages import ORACLE_ENGINE
from csa_conform.golden.carries import omitted_carries
from csa_conform.golden.edits import BIAS, Stream, fitted, heads, index_heads, restarted, rows
from csa_conform.oracle import run_step
from csa_conform.spec import STAGE_NAMES, launches_for_ratio

VANISHES, PERSISTS, NOT_RUN = "vanishes", "persists", "not run"
# A sink logit whose weight exp(sink - max) is 0 for any finite row maximum: the sink takes no mass, as an
# absent one would (the contract keeps head_sink required and finite).
NO_SINK = float(np.finfo(np.float32).min)
ATTENTION = ("candidate_assembly", "sparse_sink_softmax_attention")


@dataclass(frozen=True)
class Ablation:
    """One neutralised ingredient: its key, what it sets, the stages whose result it can move, and the edit
    (the one-step stream and the first differing element's coordinates -> the edited stream, or why not)."""

    key: str
    change: str
    stages: tuple[str, ...]
    edit: Callable[[Stream, Mapping[str, int]], Stream | str]


def _set(name: str, value: float, what: str):
    """An edit that fills input ``name`` with ``value``; not run where the step has no such input or it holds
    that value everywhere already."""
    def edit(stream: Stream, _: Mapping[str, int]) -> Stream | str:
        step = stream.steps[0]
        if name not in step:
            return f"the step has no {name}"
        array = np.asarray(step[name])
        filled = np.full_like(array, value)
        if array.tobytes() == filled.tobytes():
            return f"{name} is {what} already"
        return replace(stream, steps=({**step, name: filled},))
    return edit


def _scale_one(stream: Stream, _: Mapping[str, int]) -> Stream | str:
    if float(stream.attrs.get("scale", 0.0)) == 1.0:
        return "scale is 1 already"
    return replace(stream, attrs={**stream.attrs, "scale": 1.0})


def _scale_default(stream: Stream, _: Mapping[str, int]) -> Stream | str:
    if float(stream.attrs.get("scale", 0.0)) == 0.0:
        return "scale is the default already"
    return replace(stream, attrs={**stream.attrs, "scale": 0.0})


def _from_zero(stream: Stream, _: Mapping[str, int]) -> Stream | str:
    if stream.start == 0:
        return "the step starts at position 0 already"
    return fitted(restarted(stream, 0, stream.tokens))


def _one_row(stream: Stream, where: Mapping[str, int]) -> Stream | str:
    if stream.batch == 1:
        return "the step has one batch row already"
    return rows(stream, [where.get("b", 0)])


def _one_head(stream: Stream, where: Mapping[str, int]) -> Stream | str:
    if stream.heads == 1:
        return "the step has one head already"
    return heads(stream, [where.get("h", 0)])


def _one_index_head(stream: Stream, where: Mapping[str, int]) -> Stream | str:
    if stream.index_heads <= 1:
        return "the step has one index head already" if stream.index_heads else "the step has no index heads"
    return index_heads(stream, [where.get("i", 0)])


ABLATIONS = (
    Ablation("attention_bias=0", "attention_bias = 0", ATTENTION, _set(BIAS, 0.0, "0")),
    Ablation("no-sink", "head_sink = -FLT_MAX (its softmax weight is 0)", ATTENTION, _set("head_sink", NO_SINK,
                                                                                          "-FLT_MAX")),
    Ablation("scale=1", "scale = 1", ATTENTION, _scale_one),
    Ablation("scale=default", "scale = 0 (the contract's default, 1/sqrt(D))", ATTENTION, _scale_default),
    Ablation("compressor_ape=0", "compressor_ape = 0", ("compression_update",), _set("compressor_ape", 0.0, "0")),
    Ablation("index_compressor_ape=0", "index_compressor_ape = 0", ("index_key_update",),
             _set("index_compressor_ape", 0.0, "0")),
    Ablation("compressor_norm=1", "compressor_norm = 1", ("compression_update",), _set("compressor_norm", 1.0, "1")),
    Ablation("index_compressor_norm=1", "index_compressor_norm = 1", ("index_key_update",),
             _set("index_compressor_norm", 1.0, "1")),
    Ablation("index_weight=1", "index_weight = 1", ("index_scoring", "selection"), _set("index_weight", 1.0, "1")),
    Ablation("position-0", "the same tokens as a fresh prefill from position 0", STAGE_NAMES, _from_zero),
    Ablation("one-row", "only batch row b={b} (the first differing element's)", STAGE_NAMES, _one_row),
    Ablation("one-head", "only head h={h} (the first differing element's)", ATTENTION, _one_head),
    Ablation("one-index-head", "only index head i={i} (the first differing element's)",
             ("index_query_finalize", "index_scoring", "selection"), _one_index_head),
)


def _where(diffs) -> dict[str, int]:
    """The batch row, head and index head of the stage's first differing element ("b=0 s=1 h=2 d=11")."""
    first = next((diff.first for diff in diffs if diff.first is not None), None)
    coords = dict(part.split("=", 1) for part in str(first["coords"] if first else "").split() if "=" in part)
    return {axis: int(index) for axis, index in coords.items() if axis in ("b", "h", "i")}


def _device_stages(ratio: int, stages: Sequence[str]) -> frozenset[str]:
    """Every stage computed on the host but those of the launches that compute ``stages``: an isolated
    stage reads only the oracle's upstream, so the others cannot move its result."""
    kept = {name for launch in launches_for_ratio(ratio) if set(stages) & set(launch.stages) for name in launch.stages}
    return frozenset(STAGE_NAMES) - kept


@dataclass(frozen=True)
class Variant:
    """An ablated step that ran: its inputs, the oracle's stages and the device's (isolated: the device's stage
    read the oracle's upstream), so that a hypothesis can be re-run on it and held to what the device did."""

    key: str
    change: str
    g: StepGeometry
    inputs: Mapping[str, np.ndarray]
    expected: Mapping
    actual: Mapping
    differing: int


def ablate(attrs: Mapping, output_names: Sequence[str], inputs: Mapping[str, np.ndarray], stage: str, diffs,
           runner: DeviceRunner, ulp: int = 0, variants: list[Variant] | None = None) -> list[dict]:
    """Each ablation that can move ``stage``: what it changed, and whether the stage still diverges there
    (each variant that ran is appended to ``variants``)."""
    ratio = int(attrs["compression_ratio"])
    if not any(stage in launch.stages for launch in launches_for_ratio(ratio)):
        return []  # no kernel computes it (writeback): with every stage on the host nothing could diverge
    stream = Stream(dict(attrs), tuple(output_names), ({**inputs, **omitted_carries(dict(attrs), dict(inputs))},),
                    (frozenset(),))
    where = _where(diffs)
    results = []
    for ablation in ABLATIONS:
        if stage not in ablation.stages:
            continue
        edited = ablation.edit(stream, where)
        result = {"key": ablation.key, "change": ablation.change.format(**{"b": 0, "h": 0, "i": 0, **where})}
        if isinstance(edited, str):
            results.append({**result, "outcome": NOT_RUN, "reason": edited})
            continue
        outcome, ran = _run(edited, stage, runner, ulp, {diff.tensor for diff in diffs})
        results.append({**result, **outcome})
        if ran is not None and variants is not None:
            variants.append(Variant(ablation.key, result["change"], *ran, outcome["differing"]))
    return results


def _idle(stage: str, g, tensors: set[str]) -> str | None:
    """Why the stage does none of the work that diverged on a variant (so that nothing differing there is no
    result): a compressor that completes no record still writes its carry, which a carry's divergence needs."""
    if stage in ("compression_update", "index_key_update") and g.emitted == 0 and not any(
            "carry" in tensor for tensor in tensors):
        return "the variant completes no record, so the stage writes none"
    if stage in ("index_scoring", "selection") and g.next_records == 0:
        return "the variant holds no record to score"
    return None


def _run(stream: Stream, stage: str, runner: DeviceRunner, ulp: int, tensors: set[str]) -> tuple[dict, tuple | None]:
    """(the result, and (geometry, inputs, oracle stages, device stages) where the variant ran)."""
    attrs, inputs, names = stream.attrs, stream.steps[0], list(stream.output_names)
    try:
        g = validate_step(attrs, inputs, names)
        idle = _idle(stage, g, tensors)
        expected = run_step(attrs, inputs, names, engine=ORACLE_ENGINE).stages
    except ContractError as error:
        return {"outcome": NOT_RUN, "reason": f"the contract rejects it: {error}"}, None
    if idle:
        return {"outcome": NOT_RUN, "reason": idle}, None
    try:
        actual = runner.run_step(attrs, inputs, names, reference=expected, case="ablation")
    except (ContractError, HostStageRejected) as error:
        return {"outcome": NOT_RUN, "reason": f"the device run refused it: {error}"}, None
    failing = [diff for diff in compare_step(StepOutcome(0, expected, actual=actual), [stage], ulp) if not diff.passed]
    differing = sum(diff.mismatches for diff in failing)
    return {"outcome": PERSISTS if failing else VANISHES, "differing": differing}, (g, inputs, expected, actual.stages)


def ablation_runner(runner: DeviceRunner, ratio: int, stages: Sequence[str]) -> DeviceRunner:
    """An isolated runner on the same kernels and backend that keeps only the launches of ``stages``."""
    return runner.sibling(force_host=runner.force_host | _device_stages(ratio, stages), engine=ORACLE_ENGINE)


def ablation_claim(results: list[dict], differing: int | None = None) -> Claim | None:
    """The headline's sentence from the ablations that ran: on this step the divergence vanished with each
    of these inputs neutralised (a fact about one step, not a cause: rounding can hide a bug too). A divergence
    of fewer than MIN_SUPPORT ``differing`` elements may vanish with any input that moves them: said so, weak."""
    vanishes = [result["change"] for result in results if result["outcome"] == VANISHES]
    ran = [result for result in results if result["outcome"] in (VANISHES, PERSISTS)]
    if not vanishes:
        return None
    few = differing is not None and differing < MIN_SUPPORT
    chance = (f"; the step's {differing} differing element{'s are' if differing != 1 else ' is'} few enough for "
              "any changed input to move by chance" if few else "")
    inputs = f"{len(ran)} input{'s' if len(ran) != 1 else ''}"
    return Claim(f"on this step the divergence vanishes with {'; with '.join(vanishes)} (ablation: {inputs} "
                 f"neutralised one at a time{chance})", ABLATION, 1 if few else len(ran),
                 {"vanishes": vanishes, "persists": [result["change"] for result in ran
                                                     if result["outcome"] == PERSISTS]})


def ablation_text(results: list[dict]) -> list[str]:
    """The facts: what the divergence needs (it vanishes without it) and what it does not (it persists)."""
    if not results:
        return []
    vanishes = [result["change"] for result in results if result["outcome"] == VANISHES]
    persists = [result["change"] for result in results if result["outcome"] == PERSISTS]
    lines = []
    if vanishes:
        lines.append("ablation: the divergence vanishes with " + "; with ".join(vanishes))
    if persists:
        lines.append("ablation: the divergence persists with " + "; with ".join(persists))
    skipped = [f"{result['change']} ({result['reason']})" for result in results if result["outcome"] == NOT_RUN]
    if skipped:
        lines.append("ablation not run: " + "; ".join(skipped))
    return lines
