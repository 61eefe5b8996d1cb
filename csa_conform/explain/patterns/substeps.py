"""Sub-step localization: the first sub-step of a multi-step stage whose output the device's bytes cannot
be matched to, from the reference's intermediates re-computed on the host.

A record is finalized as pool → bf16 → RMSNorm → RoPE → FP8 (attention) or
→ RoPE → Hadamard → FP4 (index keys); a query as bf16 → RoPE → Hadamard →
FP4. The stage is compared only after its last sub-step, so this module
re-runs the sub-steps (the oracle's own functions) on the stage's inputs and
asks, for every differing record or query row, which reference intermediate
the device's output is still consistent with, latest first:

- the quantizer's input: every block's codes are one of the two grid values
  bracketing the reference's input over a scale within one step of the
  reference's (and the bf16 RoPE tail is the reference's, bit for bit), so
  only the quantization differs;
- the Hadamard's input (FP4 rows): the inverse Hadamard of the device's
  values is the reference's RoPE output within the quantization error;
- the RoPE's input: the dimensions RoPE leaves alone are the reference's
  (FP8 head: bracketing codes; FP4: the inverse Hadamard) and the rotated
  tail keeps the reference's energy (a rotation at any angle, any pairing);
- an orthogonal transform of the Hadamard's input (FP4 rows): the device's
  values keep the reference's RoPE output's energy but are no inverse
  Hadamard of it, so the Hadamard differs;
- the RMSNorm's input (records): the device's values are the reference's
  RoPE output times one constant per record, so only the normalization differs;
- otherwise the first sub-step (pool for a record, bf16 for a query).

The quantization error is bounded from the device's own codes (half the
grid spacing around each code at its block's scale), the bf16 roundings by
a relative 2^-6. A difference inside those bounds is indistinguishable
from rounding and stays with the later sub-step. The rounding conventions
and RoPE positions explain tries as re-runs (csa_conform.explain.hypotheses)
name a sub-step exactly when they reproduce the device; this is the general
fallback when none does.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from csa_conform.contract import StepGeometry
from csa_conform.errors import ContractError
from csa_conform.explain.patterns.findings import SUB_STEP, Finding
from csa_conform.numerics.bf16 import bf16_round
from csa_conform.numerics.bits import differing_bits
from csa_conform.numerics.blockscale import block_power
from csa_conform.numerics.fp4 import E2M1_TABLE, FP4_BLOCK
from csa_conform.numerics.fp8 import E4M3_TABLE, FP8_BLOCK
from csa_conform.numerics.hadamard import hadamard_bf16
from csa_conform.numerics.records import decode_fp4_record, decode_fp8_record
from csa_conform.numerics.rope import compressed_rope
from csa_conform.oracle.compressor import stream
from csa_conform.oracle.pooling import rms_normalize, softmax_pool
from csa_conform.spec import BY_NAME

# The sub-steps of the multi-step stages, in order.
SUB_STEPS = {
    "compression_update": ("pool", "bf16", "RMSNorm", "RoPE", "FP8 block quantization"),
    "index_key_update": ("pool", "bf16", "RMSNorm", "RoPE", "Hadamard", "FP4 block quantization"),
    "index_query_finalize": ("bf16", "RoPE", "Hadamard", "FP4 round trip"),
}
BF16_SLACK = 2.0**-6  # relative: a bf16 rounding of each element, several times over
FAR_FROM_ONE = 1 / 16  # a per-record constant this far from 1 is no rounding difference
FP8 = (E4M3_TABLE, 448.0, 1.0e-4, FP8_BLOCK)
FP4 = (E2M1_TABLE, 6.0, 6.0 * 2.0**-126, FP4_BLOCK)

# why a row's first unmatched sub-step is the one named, per rule
REASONS = {
    "quantizer": "its codes bracket the reference's {previous} output (scale within one step): the {sub_step} "
                 "differs, or an earlier difference smaller than one code",
    "hadamard-inverse": "the inverse Hadamard of its values is the reference's {previous} output within the "
                        "quantization error, but its codes do not bracket the reference's Hadamard output",
    "rope": "the dimensions RoPE leaves alone are the reference's and the rotated tail keeps the reference's "
            "energy, but the tail is not the reference's rotation",
    "orthogonal": "its values keep the energy of the reference's {previous} output but are no inverse Hadamard of "
                  "it: another orthogonal transform",
    "scale": "its values are the reference's RoPE output times one constant per record: the normalization "
             "differs",
    "first": "no later sub-step's input is the reference's",
}


def _grid(table: np.ndarray) -> np.ndarray:
    return np.unique(np.abs(table[np.isfinite(table)]).astype(np.float64))


def _brackets(device: np.ndarray, reference: np.ndarray, form) -> np.ndarray:
    """Per block [..., blocks]: the device's values are codes bracketing the reference's input over its scale
    or one step either side."""
    table, target, floor, width = form
    grid = _grid(table)
    shape = device.shape[:-1] + (device.shape[-1] // width, width)
    d, x = device.reshape(shape).astype(np.float64), reference.reshape(shape).astype(np.float64)
    finite = np.where(np.isfinite(x), x, 0)
    power = block_power(np.maximum(np.abs(finite).max(axis=-1), floor), target)
    found = np.zeros(shape[:-1], dtype=bool)
    for step in (-1, 0, 1):
        scale = np.ldexp(1.0, power + step)[..., None]
        q = np.abs(d) / scale
        v = np.minimum(np.abs(finite) / scale, target)
        upper = np.minimum(np.searchsorted(grid, v, side="left"), grid.size - 1)
        lower = np.maximum(np.searchsorted(grid, v, side="right") - 1, 0)
        sign = (d == 0) | (np.signbit(d) == np.signbit(x))
        fits = ((q == grid[lower]) | (q == grid[upper])) & sign
        found |= fits.all(axis=-1)
    return found


def _half_gaps(device: np.ndarray, form) -> np.ndarray:
    """|quantization error| bound of each device value: half the larger grid gap beside its code, at the
    smallest power-of-two scale that puts every block's values on the grid."""
    table, target, _, width = form
    grid = _grid(table)
    shape = device.shape[:-1] + (device.shape[-1] // width, width)
    d = np.abs(device.reshape(shape).astype(np.float64))
    amax = d.max(axis=-1, keepdims=True)
    scale = np.ldexp(1.0, np.ceil(np.log2(np.where(amax > 0, amax / target, 1.0))).astype(np.int64))
    q = np.minimum(d / scale, target)
    index = np.clip(np.searchsorted(grid, q), 0, grid.size - 1)
    below = np.where(index > 0, grid[index] - grid[np.maximum(index - 1, 0)], 0)
    above = np.where(index < grid.size - 1, grid[np.minimum(index + 1, grid.size - 1)] - grid[index], 0)
    return (np.maximum(below, above) / 2 * scale).reshape(device.shape)


def _inverse_hadamard(values: np.ndarray) -> np.ndarray:
    """The orthonormal Walsh–Hadamard transform in binary64 (its own inverse), span order as the reference."""
    x = np.array(values, dtype=np.float64)
    width, span = x.shape[-1], 1
    while span < width:
        pairs = x.reshape(x.shape[:-1] + (width // (2 * span), 2, span))
        left, right = pairs[..., 0, :].copy(), pairs[..., 1, :].copy()
        pairs[..., 0, :], pairs[..., 1, :] = left + right, left - right
        span *= 2
    return x / np.sqrt(width)


def _norm(x: np.ndarray) -> np.ndarray:
    return np.sqrt(np.square(np.asarray(x, dtype=np.float64)).sum(axis=-1))


def _fp4_rows(device, before_rope, after_rope, hadamard, rope_dim: int, scale_fit: bool) -> np.ndarray:
    """(rule, fitted constant) of each FP4 row [rows, W]: quantizer, hadamard-inverse, rope, orthogonal, scale or
    first."""
    head = device.shape[-1] - rope_dim
    error = _norm(_half_gaps(device, FP4)) + BF16_SLACK * _norm(after_rope)
    inverse = _inverse_hadamard(device)
    rule = np.full(device.shape[:-1], "first", dtype=object)
    c = np.full(device.shape[:-1], np.nan)
    if scale_fit:
        x = after_rope.astype(np.float64)
        c = (inverse * x).sum(axis=-1) / np.maximum((x * x).sum(axis=-1), 1e-300)
        rule[_norm(inverse - c[..., None] * x) <= error] = "scale"
    rule[np.abs(_norm(device) - _norm(after_rope)) <= error] = "orthogonal"
    head_matches = _norm(inverse[..., :head] - before_rope[..., :head]) <= error
    energy = np.abs(_norm(inverse[..., head:]) - _norm(before_rope[..., head:])) <= error
    rule[head_matches & energy] = "rope"
    rule[_norm(inverse - after_rope) <= error] = "hadamard-inverse"
    rule[_brackets(device, hadamard, FP4).all(axis=-1)] = "quantizer"
    return rule, c


def _fp8_rows(device, normalized, rotated, rope_dim: int) -> np.ndarray:
    """(rule, fitted constant) of each FP8 record [rows, W]: quantizer, rope, scale or first."""
    head = device.shape[-1] - rope_dim
    brackets = _brackets(device[..., :head], normalized[..., :head], FP8).all(axis=-1)
    tail_same = (device[..., head:].view(np.uint32) == rotated[..., head:].view(np.uint32)).all(axis=-1)
    tail = _norm(rotated[..., head:])
    energy = np.abs(_norm(device[..., head:]) - tail) <= BF16_SLACK * tail
    x, d = normalized.astype(np.float64), device.astype(np.float64)
    c = (d[..., :head] * x[..., :head]).sum(axis=-1) / np.maximum((x[..., :head] ** 2).sum(axis=-1), 1e-300)
    fitted = c[..., None] * x
    blocks = np.abs(fitted[..., :head]).reshape(fitted.shape[:-1] + (-1, FP8_BLOCK)).max(axis=-1)
    floor = np.repeat(blocks * 2.0**-10, FP8_BLOCK, axis=-1)
    scaled = (np.abs(d[..., :head] - fitted[..., :head]) <= 2.0**-3 * np.abs(fitted[..., :head]) + floor).all(-1)
    scaled &= np.abs(_norm(d[..., head:]) - np.abs(c) * tail) <= BF16_SLACK * np.abs(c) * tail + 1e-30
    rule = np.full(device.shape[:-1], "first", dtype=object)
    rule[scaled] = "scale"
    rule[brackets & energy] = "rope"
    rule[brackets & tail_same] = "quantizer"
    return rule, c


NAMED = {  # rule -> index of the sub-step it names, counted back from the stage's last sub-step
    "quantizer": -1, "hadamard-inverse": -2, "orthogonal": -2, "rope": "RoPE", "scale": "RMSNorm", "first": 0,
}


def _named(stage: str, rule: str) -> str:
    steps = SUB_STEPS[stage]
    where = NAMED[rule]
    return where if isinstance(where, str) else steps[where]


def _record_chain(stage: str, g: StepGeometry, inputs: Mapping[str, np.ndarray]):
    """(normalized, rotated, hadamard or None) of every record the step emits, the reference's sub-steps."""
    kv, gate, ape, norm, _, past_carry = (inputs[name] for name in BY_NAME[stage].inputs)
    candidates, block_starts, _ = stream(g, kv, gate, ape, past_carry)
    if candidates.shape[1] == 0:
        return None
    pooled, no_finite, invalid = softmax_pool(candidates[:, :, :, 0], candidates[:, :, :, 1])
    if (no_finite | invalid).any():
        return None
    normalized = rms_normalize(pooled, norm, "")
    rotated = normalized.copy()
    width = rotated.shape[-1]
    rotated[..., width - g.rope_dim:] = compressed_rope(normalized[..., width - g.rope_dim:], block_starts[None, :])
    hadamard = hadamard_bf16(rotated) if stage == "index_key_update" else None
    return normalized, rotated, hadamard


def _records(stage: str, g: StepGeometry, inputs, reference: Mapping, device: Mapping):
    """(tensor, rules of the differing new records, their differing elements, all differing elements)."""
    tensor = "present_index_key" if stage == "index_key_update" else "present_compressed_kv"
    expected, actual = np.asarray(reference[tensor]), np.asarray(device[tensor])
    past = int(inputs[BY_NAME[stage].inputs[4]].shape[1])
    if expected.shape != actual.shape or expected.dtype != actual.dtype:
        return None
    differ = differing_bits(expected, actual)
    new = differ[:, past:].reshape(differ.shape[0], differ.shape[1] - past, -1)
    rows = np.argwhere(new.any(axis=-1))
    if not rows.size:
        return None
    chain = _record_chain(stage, g, inputs)
    if chain is None:
        return None
    normalized, rotated, hadamard = chain
    picked = actual[:, past:][rows[:, 0], rows[:, 1]]
    if stage == "index_key_update":
        values = decode_fp4_record(picked)
        judged = _fp4_rows(values, normalized[rows[:, 0], rows[:, 1]], rotated[rows[:, 0], rows[:, 1]],
                         hadamard[rows[:, 0], rows[:, 1]], g.rope_dim, scale_fit=True)
    else:
        values = decode_fp8_record(picked) if actual.dtype == np.uint8 else np.asarray(picked, dtype=np.float32)
        judged = _fp8_rows(values, normalized[rows[:, 0], rows[:, 1]], rotated[rows[:, 0], rows[:, 1]], g.rope_dim)
    counts = new[rows[:, 0], rows[:, 1]].sum(axis=-1)
    return tensor, judged, counts, int(differ.sum()), [tuple(int(i) for i in (b, past + r)) for b, r in rows]


def _queries(g: StepGeometry, inputs, reference: Mapping, device: Mapping):
    expected = np.asarray(reference["transformed"])
    actual = np.asarray(device["transformed"])
    if expected.shape != actual.shape or expected.dtype != actual.dtype:
        return None
    differ = differing_bits(expected, actual).reshape(-1, expected.shape[2], expected.shape[3])
    rows = np.argwhere(differ.any(axis=-1))
    if not rows.size:
        return None
    query = np.asarray(inputs["index_query"], dtype=np.float32)
    flat = query.reshape((-1,) + query.shape[2:])
    positions = np.tile(g.start + np.arange(g.sequence), g.batch)[:, None]
    quantized = bf16_round(flat)
    rotated = quantized.copy()
    width = rotated.shape[-1]
    rotated[..., width - g.rope_dim:] = compressed_rope(quantized[..., width - g.rope_dim:], positions)
    hadamard = hadamard_bf16(rotated)
    picked = actual.reshape(flat.shape)[rows[:, 0], rows[:, 1]]
    judged = _fp4_rows(picked, quantized[rows[:, 0], rows[:, 1]], rotated[rows[:, 0], rows[:, 1]],
                     hadamard[rows[:, 0], rows[:, 1]], g.rope_dim, scale_fit=False)
    counts = differ[rows[:, 0], rows[:, 1]].sum(axis=-1)
    where = [(int(r) // g.sequence, int(r) % g.sequence, int(i)) for r, i in rows]
    return "transformed", judged, counts, int(differ.sum()), where


def localize(stage: str, g: StepGeometry, inputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray],
             device: Mapping[str, np.ndarray]) -> Finding | None:
    """The sub-step finding for a multi-step stage's differing records or query rows (None elsewhere)."""
    if stage not in SUB_STEPS:
        return None
    try:
        with np.errstate(all="ignore"):
            found = _queries(g, inputs, reference, device) if stage == "index_query_finalize" else _records(
                stage, g, inputs, reference, device)
    except (ContractError, KeyError):
        return None
    if found is None:
        return None
    tensor, (rules, factors), counts, differing, where = found
    steps = SUB_STEPS[stage]
    named = np.array([_named(stage, rule) for rule in rules], dtype=object)
    tally = {step: int((named == step).sum()) for step in steps if (named == step).any()}
    sub_step = max(tally, key=lambda step: (tally[step], -steps.index(step)))
    chosen = named == sub_step
    rule = max({r for r, n in zip(rules, named) if n == sub_step}, key=lambda r: int(((rules == r) & chosen).sum()))
    unit = "query rows" if stage == "index_query_finalize" else "records"
    position = steps.index(sub_step)
    previous = steps[position - 1] if position else "input"
    reason = REASONS[rule].format(previous=previous, sub_step=sub_step)
    matched = list(steps[:position])
    headline = (f"the first sub-step whose output the device's bytes cannot be matched to is {sub_step} "
                f"({' → '.join(steps)}): in {int(chosen.sum()):,} of {len(rules):,} differing {unit} {reason}")
    evidence = {"sub_step": sub_step, "sub_steps": list(steps), "method": "intermediates", "rule": rule,
                "matched": matched, unit.replace(" ", "_"): len(rules), "verdicts": tally,
                "first": list(where[int(np.argmax(chosen))])}
    if rule == "scale":
        evidence["factor"] = float(np.median(factors[chosen & (rules == "scale")]))
        headline += f" (× {evidence['factor']:.4g})"
    # every differing attention record kept the reference's bf16 RoPE tail: nothing acting in RoPE differs
    evidence["rope_exact"] = stage == "compression_update" and bool((rules == "quantizer").all())
    # no libm, FMA or flush-to-zero variant makes another orthogonal transform or a constant factor far from 1
    evidence["structural"] = rule == "orthogonal" or (rule == "scale" and abs(evidence["factor"] - 1) > FAR_FROM_ONE)
    return Finding(SUB_STEP, stage, tensor, headline, int(counts[chosen].sum()), differing, evidence)
