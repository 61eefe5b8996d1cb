"""An earlier sub-step's values: where the device holds, bit for bit, what the reference held before a later sub-step.

A multi-step stage (a compressor's pool → bf16 → RMSNorm → RoPE (→ Hadamard) → FP8/FP4 quantization; the
index query's bf16 → RoPE → Hadamard → FP4 round trip) keeps each sub-step's output in the oracle (the
probes' named intermediates, csa_conform.explain.probes). Where the stage's differing elements hold, bit
for bit in the tensor's own format (a packed record decoded as its format defines), the reference's
output of one sub-step at the same place, the sub-steps after it were not applied there: a fact about the
bytes, stated as an observation (the index query's own input, unrounded, counts as the output before its
first sub-step). The latest sub-step that matches is the one named (an earlier one that
the later leaves alone at those places holds the same values); claimed on every differing element, or on
at least DECISIVE of them (the count stated), and never on fewer than MIN_SUPPORT non-zero values, since a
zero is everyone's value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from csa_conform.contract import StepGeometry
from csa_conform.explain.claims import OBSERVATION
from csa_conform.explain.patterns import SUB_STEP, Finding
from csa_conform.explain.patterns.findings import DECISIVE, MIN_SUPPORT
from csa_conform.explain.patterns.substeps import SUB_STEPS
from csa_conform.explain.probes import oracle_probes
from csa_conform.numerics.bits import differing_bits
from csa_conform.numerics.records import FP4_RECORD_BYTES, FP8_RECORD_BYTES, decode_fp4_record, decode_fp8_record

# The stage's record tensors (the cache, and its decoded view) and the input that holds the past records.
RECORDS = {"compression_update": (("present_compressed_kv", "logical_records"), "past_compressed_kv"),
           "index_key_update": (("present_index_key", "logical_keys"), "past_index_key")}
# The intermediates of each sub-step, full width, in pipeline order: the probes' names; RoPE's probe holds only
# the rotated tail, which replaces the tail of the sub-step before it.
INTERMEDIATES = {"pooled": "pool", "bf16": "bf16", "rmsnorm": "RMSNorm", "rope": "RoPE", "hadamard": "Hadamard"}
# The stage input a first sub-step takes as it is (the index query's unrounded f32, before its bf16 rounding).
INPUT = "input"
FIRST_INPUT = {"index_query_finalize": "index_query"}


@dataclass(frozen=True)
class Held:
    """The device's values at a tensor's differing elements and the reference's sub-step outputs there."""

    tensor: str
    device: np.ndarray  # the new records or query rows, in the values domain (records decoded)
    reference: np.ndarray  # the reference's final values, same shape
    intermediates: dict[str, np.ndarray]  # sub-step -> its output, same shape
    outside: int  # differing elements of the tensor that no unit here covers (past records)


def earlier_sub_step(stage: str, g: StepGeometry, inputs: Mapping[str, np.ndarray],
                     upstream: Mapping[str, Mapping[str, np.ndarray]], expected: Mapping[str, np.ndarray],
                     actual: Mapping[str, np.ndarray]) -> Finding | None:
    """The observation that the device holds an earlier sub-step's output at the differing elements of one of
    the stage's tensors, or None."""
    if stage not in SUB_STEPS:
        return None
    probes = oracle_probes(stage, g, inputs, upstream)
    intermediates = _full_width(probes, g.rope_dim)
    if not intermediates:
        return None
    if FIRST_INPUT.get(stage) in inputs:
        intermediates = {INPUT: np.asarray(inputs[FIRST_INPUT[stage]], dtype=np.float32), **intermediates}
    for held in _held(stage, g, inputs, expected, actual, intermediates):
        found = _observed(stage, held)
        if found is not None:
            return found
    return None


def _full_width(probes: Mapping[str, np.ndarray], rope_dim: int) -> dict[str, np.ndarray]:
    """Each sub-step's output as whole rows, in pipeline order (RoPE's tail set into the sub-step before it)."""
    full: dict[str, np.ndarray] = {}
    before = None
    for name, sub_step in INTERMEDIATES.items():
        if name not in probes:
            continue
        values = np.asarray(probes[name], dtype=np.float32)
        if name == "rope":
            if before is None or values.shape[-1] != rope_dim:
                continue
            values, tail = before.copy(), values
            values[..., values.shape[-1] - rope_dim:] = tail
        full[sub_step] = values
        before = values
    return full


def _held(stage: str, g: StepGeometry, inputs, expected, actual, intermediates: dict[str, np.ndarray]):
    """Each judged tensor of the stage as Held: the new records of a compressor (decoded), the query rows."""
    if stage == "index_query_finalize":
        if "transformed" not in actual:
            return
        reference, device = np.asarray(expected["transformed"]), np.asarray(actual["transformed"])
        if reference.shape != device.shape:
            return
        yield Held("transformed", device, reference, {step: values.reshape(reference.shape) for step, values
                                                      in intermediates.items() if values.size == reference.size}, 0)
        return
    width = next(iter(intermediates.values())).shape
    tensors, past_input = RECORDS.get(stage, ((), ""))
    past = int(np.shape(inputs[past_input])[1]) if past_input in inputs else -1
    for tensor in tensors:
        if tensor not in actual or tensor not in expected:
            continue
        reference, device = np.asarray(expected[tensor]), np.asarray(actual[tensor])
        if reference.shape != device.shape or reference.dtype != device.dtype or reference.ndim != 3:
            continue
        if past < 0 or reference.shape[1] - past != width[1]:
            continue
        everywhere = int(np.count_nonzero(differing_bits(reference, device)))
        new_reference, new_device = _decoded(reference[:, past:]), _decoded(device[:, past:])
        if new_reference is None or new_device is None or new_reference.shape != width:
            continue
        inside = int(np.count_nonzero(differing_bits(reference[:, past:], device[:, past:])))
        yield Held(tensor, new_device, new_reference,
                   {step: values for step, values in intermediates.items() if values.shape == width},
                   everywhere - inside)


def _decoded(records: np.ndarray) -> np.ndarray | None:
    """Records as the values their format defines: FP8 (head blocks and bf16 tail) or FP4 decoded, f32 as is."""
    if records.dtype == np.float32:
        return records
    if records.dtype == np.uint8 and records.shape[-1] == FP8_RECORD_BYTES:
        return decode_fp8_record(records)
    if records.dtype == np.uint8 and records.shape[-1] == FP4_RECORD_BYTES:
        return decode_fp4_record(records)
    return None


def _observed(stage: str, held: Held) -> Finding | None:
    differ = differing_bits(held.reference, held.device)
    total = int(np.count_nonzero(differ)) + held.outside
    if not differ.any():
        return None
    device = held.device[differ].view(np.uint32)
    order = (INPUT,) + SUB_STEPS[stage]
    steps = [step for step in order if step in held.intermediates]
    for step in reversed(steps):
        values = np.ascontiguousarray(held.intermediates[step][differ])
        same = values.view(np.uint32) == device
        matched = int(np.count_nonzero(same))
        support = int(np.count_nonzero(same & (values != 0)))
        if support < MIN_SUPPORT or matched < DECISIVE * total:
            continue
        after = _acting(held, differ, step, list(order[order.index(step) + 1:]))
        if not after:
            continue
        listing = _listing(after)
        what = f"the stage's {FIRST_INPUT[stage]} input as it is" if step == INPUT else f"the reference's {step} output"
        identity = ", or RoPE applied at position 0, which rotates nothing" if "RoPE" in after else ""
        headline = (f"at the {total:,} differing elements of {held.tensor} the device holds {what}, "
                    f"before {listing} (bit for bit at {matched:,} of {total:,}): {listing} "
                    f"{'is' if len(after) == 1 else 'are'} not applied there{identity}")
        return Finding(SUB_STEP, stage, held.tensor, headline, matched, total,
                       {"sub_step": step, "not_applied": after, "held": step, "support": support,
                        "method": "held values"}, source=OBSERVATION)
    return None


def _acting(held: Held, differ: np.ndarray, step: str, after: list[str]) -> list[str]:
    """The sub-steps after ``step`` that change the reference's values at the differing elements: one that leaves
    them alone there (the FP8 quantization and a record's bf16 RoPE tail) is no sub-step left out there. The last
    one's output is the tensor's final values."""
    outputs = [held.intermediates[name] if name in held.intermediates else None for name in after]
    outputs[-1] = held.reference
    acting, before = [], held.intermediates[step]
    for name, output in zip(after, outputs):
        if output is None:  # no full-width intermediate: it may act anywhere
            acting.append(name)
            continue
        if (np.ascontiguousarray(output[differ]).view(np.uint32)
                != np.ascontiguousarray(before[differ]).view(np.uint32)).any():
            acting.append(name)
        before = output
    return acting


def _listing(steps: list[str]) -> str:
    named = [f"the {step}" if step.startswith(("FP", "Hadamard", "pool")) else step for step in steps]
    return named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]
