"""Sub-step probes: the first divergent sub-step of a stage observed on the device, not inferred.

The divergent step is run once more, isolated, on a build of the same kernel directory with
-DCSA_PROBES (csa_conform.device.probes): every CSA_PROBE the kernel reaches copies a sub-step's output
(pooled vector, bf16 values, RMSNorm, RoPE, Hadamard, block scales and codes, index dots, ReLUs and
scores, softmax maximum, denominator and probabilities) into a log the runner reads back. The oracle
re-runs the stage capturing the same names (``Numerics(probes=...)``). Compared bit for bit in pipeline
order, the first probe whose bytes differ is the first divergent sub-step, as a fact, with its own
element-level difference. A probe may change what the kernel computes (it must not:
a compiler could schedule the code around it differently), so the probed run's stage payloads are
compared with the unprobed run's first; where any byte moved the probes are reported and not trusted.
A Python provider is probed the same way: its probed re-run hands each call a ``probe(name, array)`` callback
(csa_conform.device.provider), and the whole intermediates it shows are compared as the kernel's entries are.
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from csa_conform.contract import StepGeometry
from csa_conform.device.probes import (ProbeLog, attention_units, compressor_units, placed, query_units,
                                        scored_record_units, softmax_slot_units)
from csa_conform.device.provider import ProvidedProbes
from csa_conform.errors import ContractError
from csa_conform.explain.claims import PROBE, Claim
from csa_conform.explain.stages import ORACLE_ENGINE, run_stage
from csa_conform.explain.values import Part, part_claims
from csa_conform.numerics.bits import differing_bits, unsigned
from csa_conform.numerics.variant import Numerics
from csa_conform.oracle.index_scoring import causal_records
from csa_conform.spec import STAGE_NAMES, launches_for_ratio

# The probes of each stage in pipeline order: the names the prelude's CSA_PROBE calls and the oracle use.
PROBED = {
    "compression_update": ("pool_scores", "pooled", "bf16", "rmsnorm", "rope", "fp8_scale", "fp8_codes"),
    "index_key_update": ("pool_scores", "pooled", "bf16", "rmsnorm", "rope", "hadamard", "fp4_scale", "fp4_codes"),
    "index_query_finalize": ("bf16", "rope", "hadamard", "fp4_scale", "fp4_codes"),
    "index_scoring": ("index_dots", "index_relu", "index_score"),
    "sparse_sink_softmax_attention": ("softmax_max", "softmax_denominator", "softmax_probabilities"),
}
SUB_STEP = {"pool_scores": "gate + APE scores", "pooled": "pool", "bf16": "bf16", "rmsnorm": "RMSNorm", "rope": "RoPE",
            "hadamard": "Hadamard", "fp8_scale": "FP8 block scale", "fp8_codes": "FP8 codes", "fp4_scale": "FP4 block scale",
            "fp4_codes": "FP4 codes", "logits": "logits", "softmax_max": "softmax maximum",
            "softmax_denominator": "softmax denominator", "index_dots": "index dots", "index_relu": "index ReLU",
            "index_score": "index score", "softmax_probabilities": "softmax probabilities"}
# A sub-step before the probes whose output is already a payload tensor of the stage: compared first, as a probe.
PAYLOAD_FIRST = {"sparse_sink_softmax_attention": ("logits", "scores")}
# What a stage computes before a probe that no probe observes, and whose output only that probe reads: where that
# probe is the first to differ, the divergence may start there (where it is equal, it did not).
UNPROBED_BEFORE = {
    "compression_update": {"pool_scores": "the rows' scores written into the carry, or carried over from the past one",
                           "pooled": "the kv rows' copy into the carry"},
    "index_key_update": {"pool_scores": "the rows' scores written into the carry, or carried over from the past one",
                         "pooled": "the kv rows' copy into the carry"},
}
# What a unit's several calls of a probe are (else its quantization blocks): candidate slots, index heads.
CALLS = {"pool_scores": "slot", "index_dots": "i", "index_relu": "i"}
ELEMENT = {"logits": "c"}  # the axis of a probe's elements (else d)
# Probes compared with either zero as +0: which zero a maximum holds is the order's pick, and no x - max moves.
SIGNLESS_ZERO = ("softmax_max",)
EQUAL, DIFFERS, UNOBSERVED = "equal", "differs", "unobserved"
# The device's calls of a probe wrote another number of elements than the reference's sub-step computes: that
# sub-step ran over another extent (a width or count passed wrong), a divergence of the sub-step itself.
EXTENT = "extent"
# The reference's values, every one, in other places: the kernel computed them in another order of calls or units
# (a head loop run backwards), which says nothing of their values.
REORDERED = "reordered"
# What each probed stage computes after its last probe: where a divergence arises when every probe is equal.
AFTER_PROBES = {
    "compression_update": ("the record's packing (E8M0 scale bytes, E4M3 codes, bf16 RoPE tail) or f32 dequantization",
                           "the record's write into present_compressed_kv", "the compression carry's update"),
    "index_key_update": ("the record's packing (E8M0 scale bytes, E2M1 codes)",
                         "the record's write into present_index_key", "the index carry's update"),
    "index_query_finalize": ("the FP4 round trip's dequantization", "the write of transformed"),
    "index_scoring": ("the write of scores",),
    "sparse_sink_softmax_attention": ("the P·V value sum", "the write of Y"),
}
# The element format of a probe that is not binary32, for its value classes (packed FP4 codes get none).
FORM = {"fp8_codes": "e4m3", "fp8_scale": "e8m0", "fp4_scale": "e8m0", "fp4_codes": ""}


def probed_launches(ratio: int, stages, calls=None) -> set[str]:
    """The stages of every launch (or provider call: ``calls``, each its stages) that computes one of ``stages``
    with probes (what a probed run keeps on the device; everything else runs on the host oracle)."""
    kept: set[str] = set()
    for members in (launch.stages for launch in launches_for_ratio(ratio)) if calls is None else calls:
        if any(stage in PROBED and stage in members for stage in stages):
            kept.update(members)
    return kept


def _module(stage: str, ratio: int) -> str:
    return next(launch.module for launch in launches_for_ratio(ratio) if stage in launch.stages)


def _units(stage: str, g: StepGeometry, reference: Mapping[str, np.ndarray], threads: int):
    """(units, unit shape, axis names) of a stage's probes: records of a compressor, query heads of index
    select, causal records of index scoring."""
    if stage == "index_scoring":
        records = int(reference["index_score"].shape[-1]) if "index_score" in reference else 0
        return scored_record_units(g.sequence, causal_records(g), threads), (g.batch, g.sequence, records), (
            "b", "s", "record")
    if stage == "index_query_finalize":
        return query_units(g.sequence, g.index_heads, threads), (g.batch, g.sequence, g.index_heads), ("b", "s", "i")
    if stage == "sparse_sink_softmax_attention":
        return attention_units(g.sequence, g.heads), (g.batch, g.sequence, g.heads), ("b", "s", "h")
    records = int(reference["pooled"].shape[1]) if "pooled" in reference else 0
    return compressor_units(records), (g.batch, records), ("b", "record")


def _placement(stage: str, name: str, g: StepGeometry, reference: Mapping[str, np.ndarray], threads: int,
               payload: Mapping[str, np.ndarray] | None):
    """(units, unit shape, axis names, the units computed: None for all) of one probe, or why it cannot be
    placed. Index scoring computes causal records only, attention's probabilities the valid slots of a row
    that has one (the device's logits say which); elsewhere both sides hold 0."""
    if name == "softmax_probabilities":
        if payload is None or "scores" not in payload:
            return "the device's logits, which mark the slots it computes probabilities for, were not read back"
        logits = np.asarray(payload["scores"])
        with np.errstate(invalid="ignore"):  # fmaxf's row maximum: a NaN logit is valid but never the maximum
            active = np.fmax.reduce(logits, axis=-1, initial=-np.inf) != -np.inf
        computed = (logits != -np.inf) & active[..., None]
        return softmax_slot_units(g.sequence, g.heads, threads, computed), logits.shape, ("b", "s", "h", "c"), computed
    units, unit_shape, axes = _units(stage, g, reference, threads)
    if stage == "index_scoring":
        causal = np.arange(unit_shape[-1]) < causal_records(g)[:, None]
        return units, unit_shape, axes, np.broadcast_to(causal, unit_shape)
    return units, unit_shape, axes, None


def _value(array: np.ndarray, flat: int) -> dict:
    value = array.reshape(-1)[flat]
    if array.dtype.kind == "f":
        bits = int(np.asarray(value).view(np.uint32))
        return {"value": str(np.float32(value)), "bits": f"0x{bits:08x}"}  # binary32's shortest digits
    return {"value": int(value), "bits": f"0x{int(value):02x}"}


def _compare(name: str, reference: np.ndarray, device: np.ndarray, axes: tuple[str, ...]) -> dict:
    """The element-level difference of one probe; ``device`` is [*units, calls per unit, elements]."""
    per = device.shape[-2]
    if reference.size != device.size:
        return {"name": name, "sub_step": SUB_STEP.get(name, name), "status": EXTENT,
                "reason": f"the device wrote {device.size:,} elements, the reference has {reference.size:,}",
                "elements": int(device.size), "reference_elements": int(reference.size)}
    reference = np.ascontiguousarray(reference).reshape(device.shape)
    differ = differing_bits(reference, device)
    status = EQUAL if not differ.any() else REORDERED if _same_values(reference, device) else DIFFERS
    result = {"name": name, "sub_step": SUB_STEP.get(name, name), "status": status,
              "differing": int(differ.sum()), "elements": int(differ.size)}
    if differ.any():
        flat = int(np.argmax(differ.reshape(-1)))
        index = np.unravel_index(flat, device.shape)
        element = ((ELEMENT.get(name, "d"),), (index[-1],)) if device.shape[-1] > 1 else ((), ())
        names = axes + ((CALLS.get(name, "block"),) if per > 1 else ()) + element[0]
        kept = index[: len(axes)] + ((index[-2],) if per > 1 else ()) + element[1]
        result["first"] = {"coords": dict(zip(names, (int(i) for i in kept))),
                           "reference": _value(reference, flat), "device": _value(device, flat)}
        result["classes"], result["class_counts"] = _classes(name, reference, device)
    return result


def _same_values(reference: np.ndarray, device: np.ndarray) -> bool:
    """Whether the device holds the reference's values bit for bit, each as often, wherever they sit."""
    return bool(np.array_equal(np.sort(unsigned(reference).reshape(-1)), np.sort(unsigned(device).reshape(-1))))


def _classes(name: str, reference: np.ndarray, device: np.ndarray) -> tuple[list[str], list[str]]:
    """The value classes at the probe's differing elements: the statements one pair or one relation makes of
    them all, and else the counts of the commonest pairs."""
    form = FORM.get(name, "f32" if device.dtype == np.float32 else "int")
    if not form:
        return [], []
    width = device.shape[-1]
    claims, counts = part_claims(Part(SUB_STEP.get(name, name), form, reference.reshape(-1, width),
                                      device.reshape(-1, width)))
    return [claim.text for claim in claims], counts


def oracle_probes(stage: str, g: StepGeometry, inputs, upstream) -> dict[str, np.ndarray]:
    """The reference's named sub-step outputs of one stage (nothing where the oracle rejects the step)."""
    captured: dict[str, np.ndarray] = {}
    try:
        with np.errstate(all="ignore"):
            run_stage(stage, g, inputs, upstream, Numerics(probes=captured))
    except ContractError:
        return {}
    return captured


def observe(stage: str, g: StepGeometry, inputs, expected, logs: list[ProbeLog], threads: int,
            moved: list[str], payload: Mapping[str, np.ndarray] | None = None) -> dict:
    """The probe observation of one divergent stage: every probe compared in pipeline order, the first that
    differs, and whether probing moved the kernel's bytes (``moved``: the tensors that differ from the
    unprobed run's; ``payload``, the device's stage payload, for a sub-step whose output it holds)."""
    module = _module(stage, g.ratio)
    log = next((log for log in logs if log.module == module), None)
    reference = oracle_probes(stage, g, inputs, expected)
    def written(name: str) -> tuple[np.ndarray, tuple[str, ...]] | str:
        entries = log.named(name) if log is not None else []
        if not entries:
            return "the kernel wrote no such probe"
        placement = _placement(stage, name, g, reference, threads, payload)
        if isinstance(placement, str):
            return placement
        units, unit_shape, axes, computed = placement
        device = placed(entries, units, unit_shape, reference[name].dtype, computed)
        if isinstance(device, str):
            return f"its entries cannot be placed on the reference's axes: {device}"
        return device, axes

    return compared(stage, reference, expected, _units(stage, g, reference, threads)[2], written, module, moved,
                    payload, log.dropped if log is not None else 0)


def compared(stage: str, reference: Mapping[str, np.ndarray], expected, axes: tuple[str, ...],
             written: Callable[[str], tuple[np.ndarray, tuple[str, ...]] | str], module: str, moved: list[str],
             payload: Mapping[str, np.ndarray] | None = None, dropped: int = 0) -> dict:
    """Every probe of a stage compared with the reference's intermediate in pipeline order, and the first that
    differs; ``written(name)`` is the device's intermediate as [*units, calls per unit, elements] with the
    units' axis names, or why there is none (``axes``: those of the stage's own units, for a payload tensor)."""
    probes = []
    if stage in PAYLOAD_FIRST and payload is not None:
        name, tensor = PAYLOAD_FIRST[stage]
        held = np.asarray(payload[tensor])
        probes.append(_compare(name, np.asarray(expected[stage][tensor]), held.reshape(
            held.shape[:-1] + (1, held.shape[-1])), axes))
    for name in PROBED[stage]:
        if name not in reference:
            probes.append({"name": name, "sub_step": SUB_STEP[name], "status": UNOBSERVED,
                           "reason": "the reference computes no such intermediate for this step"})
            continue
        device = written(name)
        if isinstance(device, str):
            probes.append({"name": name, "sub_step": SUB_STEP[name], "status": UNOBSERVED, "reason": device})
            continue
        device, name_axes = device
        if name in SIGNLESS_ZERO:
            device, expected_values = device + np.float32(0), reference[name] + np.float32(0)
        else:
            expected_values = reference[name]
        probes.append(_compare(name, expected_values, device, name_axes))
    first = next((probe for probe in probes if probe["status"] in (DIFFERS, EXTENT)), None)
    before = probes[: probes.index(first)] if first is not None else probes
    unobserved = [probe["sub_step"] for probe in before if probe["status"] == UNOBSERVED]
    if first is not None and first["name"] in UNPROBED_BEFORE.get(stage, {}):
        unobserved.append(UNPROBED_BEFORE[stage][first["name"]])
    # a probe before it that holds the reference's values in other places may be where values first went wrong
    moved_before = [probe for probe in before if probe["status"] == REORDERED]
    return {"module": module, "probes": probes, "first_divergent": None if first is None else first["sub_step"],
            "exact": first is not None and not unobserved and not moved_before, "unobserved_before": unobserved,
            "after_probes": list(AFTER_PROBES[stage]), "dropped": dropped, "moved": moved,
            "trusted": not moved and not dropped}


def probe_text(observation: dict) -> str:
    """One line: the first divergent sub-step as the probes saw it (or why they are not trusted)."""
    if "error" in observation:
        return f"probes failed: {observation['error']}"
    if observation["moved"]:
        changed, unprobed = (("call changed the provider's own payloads", "call") if "defects" in observation
                             else ("build changed the kernel's own bytes", "kernel"))  # a provider's run has defects
        return (f"probes not trusted: the probed {changed} (" + ", ".join(observation["moved"])
                + f"), so its intermediates need not be the unprobed {unprobed}'s")
    if observation["dropped"]:
        return f"probes not trusted: the probe log had no room for {observation['dropped']:,} entries"
    seen = [probe for probe in observation["probes"] if probe["status"] != UNOBSERVED]
    if not seen:
        reasons: dict[str, list[str]] = {}
        for probe in observation["probes"]:
            reasons.setdefault(probe["reason"], []).append(probe["sub_step"])
        return "probes: none observed (" + "; ".join(
            f"{', '.join(steps)}: {reason}" for reason, steps in reasons.items()) + ")"
    first = next((probe for probe in observation["probes"] if probe["status"] in (DIFFERS, EXTENT)), None)
    equal = [probe["sub_step"] for probe in observation["probes"][: observation["probes"].index(first)]
             if probe["status"] == EQUAL] if first is not None else [probe["sub_step"] for probe in seen]
    moved = _reordered(observation["probes"] if first is None else
                       observation["probes"][: observation["probes"].index(first)])
    if first is None:
        unseen = [probe["sub_step"] for probe in observation["probes"] if probe["status"] == UNOBSERVED]
        unseen_text = f"; not observed: {', '.join(unseen)}" if unseen else ""
        if moved:
            equal = [probe["sub_step"] for probe in seen if probe["status"] == EQUAL]
            return (f"probes: no observed sub-step holds a value the reference does not ({', '.join(equal)} "
                    f"equal{moved}{unseen_text}): the divergence is in where values went or in what no probe saw")
        return (f"probes: every observed sub-step is the reference's bit for bit ({', '.join(equal)}{unseen_text}): "
                f"the divergence is in what no probe saw{_unprobed(observation)}")
    exact = "".join(f" ({hedge}, so it may start there)" for hedge in _hedges(observation, first))
    agree = (f"{', '.join(equal)} equal" if equal else "") + moved
    agree = f"{agree.removeprefix('; ')}; " if agree else ""
    if first["status"] == EXTENT:
        return (f"probe: the first divergent sub-step is {first['sub_step']}{exact} — {agree}{first['sub_step']}: "
                f"{_extent(first)}")
    where = ", ".join(f"{axis}={index}" for axis, index in first["first"]["coords"].items())
    ref, dev = first["first"]["reference"], first["first"]["device"]
    classes = "".join(f"; {text}" for text in first.get("classes", []) + first.get("class_counts", []))
    return (f"probe: the first divergent sub-step is {first['sub_step']}{exact} — {agree}{first['sub_step']}: "
            f"{first['differing']:,} of {first['elements']:,} elements differ, first at {where}: reference "
            f"{ref['value']} ({ref['bits']}), device {dev['value']} ({dev['bits']}){classes}")


def _before(observation: dict, first: dict) -> tuple[list[str], list[str]]:
    """Where the divergence may start before the first divergent probe: the unobserved sub-steps before it, and those
    before it that hold the reference's values in other places (values moved there may be the first wrong ones)."""
    probes = observation["probes"]
    moved = [probe["sub_step"] for probe in probes[: probes.index(first)] if probe["status"] == REORDERED]
    return list(observation["unobserved_before"]), moved


def _hedges(observation: dict, first: dict) -> list[str]:
    unseen, moved = _before(observation, first)
    return ([f"not observed before it: {', '.join(unseen)}"] if unseen else []) + (
        [f"values in other places before it: {', '.join(moved)}"] if moved else [])


def _extent(probe: dict) -> str:
    return (f"its calls wrote {probe['elements']:,} elements where the reference's {probe['sub_step']} computes "
            f"{probe['reference_elements']:,}: it ran over another extent")


def _reordered(probes: list[dict]) -> str:
    """The probes among ``probes`` that hold the reference's values in other places, as a clause."""
    names = [probe["sub_step"] for probe in probes if probe["status"] == REORDERED]
    return f"; {', '.join(names)}: the reference's values, in other places" if names else ""


def probe_claim(observation: dict | None) -> Claim | None:
    """The headline's sentence from a trusted probe run: the first sub-step whose bytes differ, observed (exact
    only when every probe before it was observed), or every observed sub-step equal; None when the probes
    failed, were not trusted or saw nothing."""
    if not observation or "error" in observation or observation["moved"] or observation["dropped"]:
        return None
    first = next((probe for probe in observation["probes"] if probe["status"] in (DIFFERS, EXTENT)), None)
    if first is not None:
        unseen, moved = _before(observation, first)
        exact = (f" or an unobserved one before it ({', '.join(unseen)})" if unseen else "") + (
            f" or one before it whose values sit in other places ({', '.join(moved)})" if moved else "")
        lead = f"the first sub-step whose probed output differs on the device is {first['sub_step']}{exact}"
        detail = {"sub_step": first["sub_step"], "exact": observation["exact"]}
        if first["status"] == EXTENT:
            return Claim(f"{lead} (probes: {_extent(first)})", PROBE, int(first["elements"]), detail)
        classes = "".join(f"; {text}" for text in first.get("classes", ()))
        return Claim(f"{lead} (probes: {first['differing']:,} of {first['elements']:,} elements differ there{classes}"
                     f"{_between(observation['probes'], first, bool(exact))})", PROBE, int(first["differing"]), detail)
    equal = [probe for probe in observation["probes"] if probe["status"] == EQUAL]
    if not equal:
        return None
    moved = _reordered(observation["probes"])
    every = "every probed sub-step" if not moved else "the probed sub-steps"
    after = "" if moved else f": the divergence arises in what no probe observed{_unprobed(observation)}"
    return Claim(f"{every} ({', '.join(probe['sub_step'] for probe in equal)}) {'are' if moved else 'is'} the "
                 f"reference's bit for bit on the device{moved}{after}", PROBE,
                 sum(int(probe["elements"]) for probe in equal), {"equal": [probe["sub_step"] for probe in equal]})


def _between(probes: list[dict], first: dict, hedged: bool) -> str:
    """Where a first divergent probe puts the divergence: a probe sees a sub-step's output, so what differs arose in
    that sub-step or in whatever the kernel did between the last equal probe and it (an operation moved there from
    elsewhere, a step of its own), as a clause."""
    at = probes.index(first)
    if at == 0:  # unless the hedge already names what comes before it
        return "" if hedged else f"; the first one probed: the divergence arises in {first['sub_step']} or before it"
    if probes[at - 1]["status"] != EQUAL:  # an unobserved or reordered one: the hedges before name it
        return ""
    return (f"; {probes[at - 1]['sub_step']} before it equal: the divergence arises in {first['sub_step']} or "
            "between the two")


def _unprobed(observation: dict) -> str:
    """The sub-steps no probe observed when every observed one is equal: the unobserved probes and everything the
    stage computes after its last probe, all of them (the divergence arises there), as a clause."""
    unseen = [probe["sub_step"] for probe in observation["probes"] if probe["status"] == UNOBSERVED]
    steps = unseen + list(observation.get("after_probes", ()))
    return f" ({'; '.join(steps)})" if steps else ""


def probe_step(runner, attrs: Mapping, output_names, inputs, expected, unprobed: Mapping, g: StepGeometry,
               stages, case: str = "", step: int = -1) -> dict[str, dict]:
    """The probe observation of each of ``stages`` that has probes: one probed, isolated re-run of the step
    that keeps only their launches (a provider's calls) on the device (``runner.sibling``); ``unprobed`` is the
    isolated run's stage payloads, which the probed run's must equal bit for bit."""
    provider = runner.provider
    calls = None if provider is None else [call.stages for call in provider.calls(g.ratio)]
    launched = {stage for members in calls or [launch.stages for launch in launches_for_ratio(g.ratio)]
                for stage in members}
    stages = [stage for stage in stages if stage in PROBED and stage in launched]
    if not stages:
        return {}
    keep = probed_launches(g.ratio, stages, calls)
    probed = runner.sibling(runner.force_host | (frozenset(STAGE_NAMES) - keep), probes=True, engine=ORACLE_ENGINE)
    result = probed.run_step(attrs, inputs, output_names, reference=expected, case=case, step=step)
    moved = [f"{stage}/{name}" for stage in STAGE_NAMES if stage in keep and stage in unprobed
             for name, array in result.stages.get(stage, {}).items()
             if name in unprobed[stage] and not _same_bits(array, unprobed[stage][name])]
    if provider is not None:
        return {stage: observe_provided(stage, g, inputs, expected, result.probes, provider.name, moved,
                                        result.stages.get(stage))
                for stage in stages}
    threads = {launch.module: launch.block[0] for launch in result.launches}
    return {stage: observe(stage, g, inputs, expected, result.probes, threads.get(_module(stage, g.ratio), 1), moved,
                           result.stages.get(stage))
            for stage in stages}


def _same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


# --- a Python provider's probes (specs/providers.md, "Probes") -------------------------------------------------

def observe_provided(stage: str, g: StepGeometry, inputs, expected, calls: list[ProvidedProbes], provider: str,
                     moved: list[str], payload: Mapping[str, np.ndarray] | None = None) -> dict:
    """The probe observation of one divergent stage of a provider: each intermediate its call showed through
    ``probe`` is the whole tensor, unit axes first, compared as a kernel's placed entries are. What the call
    showed that is no probe of its stages, or in another shape or dtype than the reference's, is a provider
    defect (``defects``), never the stage's verdict."""
    call = next(log for log in calls if stage in log.stages)
    where = f"{provider}.{call.call}"
    reference = oracle_probes(stage, g, inputs, expected)
    _, unit_shape, axes = _units(stage, g, reference, 1)
    known = [name for member in call.stages for name in PROBED.get(member, ())]
    defects = list(call.defects) + [
        f"{where} called probe({name!r}), no probe of {', '.join(call.stages)} (those are {', '.join(known) or 'none'})"
        for name in call.arrays if name not in known]

    def written(name: str) -> tuple[np.ndarray, tuple[str, ...]] | str:
        if not call.accepts:
            return f"{where} takes no probe argument"
        if name not in call.arrays:
            return "the provider made no such probe call"
        array, shape = call.arrays[name], _provided_shape(reference[name], unit_shape)
        if array.shape != shape or array.dtype != reference[name].dtype:
            defects.append(f"{where}'s probe {name!r} is {array.dtype}{list(array.shape)}, not the reference's "
                           f"{reference[name].dtype}{list(shape)}")
            return f"the provider's array is {array.dtype}{list(array.shape)}, not {reference[name].dtype}{list(shape)}"
        tail = shape[len(unit_shape):]
        return array.reshape(unit_shape + (int(np.prod(tail[:-1], dtype=np.int64)), tail[-1] if tail else 1)), axes

    observation = compared(stage, reference, expected, axes, written, where, moved, payload)
    return {**observation, "defects": defects}


def _provided_shape(reference: np.ndarray, unit_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape a provider hands a probe in: the unit axes, then the reference's axes within a unit (the oracle
    holds the index query's (b, s) rows as one axis)."""
    lead = len(unit_shape) if reference.shape[: len(unit_shape)] == tuple(unit_shape) else len(unit_shape) - 1
    return tuple(unit_shape) + reference.shape[lead:]


def defect_text(observation: dict | None) -> list[str]:
    """A line per provider defect of a probe run: a probe name no stage of the call has, a shape or dtype not
    the reference's, what was no array."""
    return [f"probe defect of the provider: {defect}" for defect in (observation or {}).get("defects", [])]
