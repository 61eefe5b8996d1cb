"""Sub-step consistency: which sub-steps of a multi-step stage the device's bytes are consistent with, from the
reference's intermediates re-computed on the host. A fit within rounding bounds, never a sub-step named.

A record is finalized as pool → bf16 → RMSNorm → RoPE → FP8 (attention) or
→ RoPE → Hadamard → FP4 (index keys); a query as bf16 → RoPE → Hadamard →
FP4. The stage is compared only after its last sub-step, so this module
re-runs the sub-steps (the oracle's own functions) on the stage's inputs and
asks, for every differing record or query row, which reference intermediate
the device's output is still consistent with, latest first:

- the quantizer's input: every block's codes are one of the two grid values
  bracketing the reference's input over a scale within one step of the
  reference's (and the bf16 RoPE tail is the reference's, bit for bit);
- the Hadamard's input (FP4 rows): the inverse Hadamard of the device's
  values is the reference's RoPE output within the quantization error;
- the RoPE's input: the dimensions RoPE leaves alone are the reference's
  (FP8 head: bracketing codes; FP4: the inverse Hadamard) and the rotated
  tail keeps the reference's energy (a rotation at any angle, any pairing);
- an orthogonal transform of the Hadamard's input (FP4 rows): the device's
  values keep the reference's RoPE output's energy, and no other differing
  row's, but are no inverse Hadamard of it;
- a constant per record (records): the device's values are the reference's
  RoPE output times one constant per record;
- normalized (records): undone back to RMSNorm's output (inverse Hadamard,
  the reference's rotation reversed, divided by the norm weight) the
  device's values have RMS 1 within the quantization error but are not the
  reference's (a row whose values also keep the Hadamard's energy is
  ambiguous and matches nothing);
- otherwise nothing: "no sub-step's output could be matched" (rule ``none``).

A differing record that is, bit for bit, the reference's record of another
place (or still the runner's poison, or its guard bands' bytes) was computed
right and written at another offset (or not at all, or copied from outside a
buffer): no sub-step differs there, so the fit leaves it to the aliasing,
never-written and guard-read findings.

Each fit leaves several sub-steps possible (CONSISTENT): a difference at any
earlier sub-step smaller than the later roundings, or a later one that keeps
what the fit measures (a per-record constant is RMSNorm's or a block scale's,
an orthogonal transform RoPE's or the Hadamard's), looks the same in the
stage's payload. So the finding lists every sub-step the bytes are
consistent with and names none (``sub_step`` null): only an experiment (a
re-run that reproduces the device bit for bit, a probe of the device's
intermediates) names one. The quantization error is bounded from the
device's own codes (half the grid spacing around each code at its block's
scale), the bf16 roundings by a relative 2^-6.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from csa_conform.contract import StepGeometry
from csa_conform.errors import ContractError
from csa_conform.explain.claims import FIT
from csa_conform.explain.patterns.findings import SUB_STEP, Finding
from csa_conform.explain.patterns.unwritten import guarded, poisoned
from csa_conform.numerics.bf16 import bf16_round
from csa_conform.numerics.bits import differing_bits, unsigned
from csa_conform.numerics.blockscale import block_power
from csa_conform.numerics.fp4 import E2M1_TABLE, FP4_BLOCK
from csa_conform.numerics.fp8 import E4M3_TABLE, FP8_BLOCK
from csa_conform.numerics.hadamard import hadamard_bf16
from csa_conform.numerics.records import decode_fp4_record, decode_fp8_record
from csa_conform.numerics.rope import compressed_rope, rope_frequencies
from csa_conform.oracle.compressor import stream
from csa_conform.oracle.pooling import rms_normalize, softmax_pool
from csa_conform.spec import BY_NAME

# The sub-steps of the multi-step stages, in order.
SUB_STEPS = {
    "compression_update": ("pool", "bf16", "RMSNorm", "RoPE", "FP8 block quantization"),
    "index_key_update": ("pool", "bf16", "RMSNorm", "RoPE", "Hadamard", "FP4 block quantization"),
    "index_query_finalize": ("bf16", "RoPE", "Hadamard", "FP4 round trip"),
}
# What a compressor's pool reads, before every sub-step: a row streamed at the wrong slot, phase or offset reaches the
# records only through the pool, and fits whatever a difference at the pool fits.
STREAMED = "the rows streamed into the carry"
BF16_SLACK = 2.0**-6  # relative: a bf16 rounding of each element, several times over
FAR_FROM_ONE = 1 / 16  # a per-record constant this far from 1 is no rounding difference
FP8 = (E4M3_TABLE, 448.0, 1.0e-4, FP8_BLOCK)
FP4 = (E2M1_TABLE, 6.0, 6.0 * 2.0**-126, FP4_BLOCK)

# what the bytes of the rows a rule covers show, per rule: facts within the stated bounds, no cause
REASONS = {
    "quantizer": "every code is one of the two grid values around the reference's quantizer input (scale within "
                 "one step)",
    "hadamard-inverse": "the inverse Hadamard of the values is the reference's RoPE output within the quantization "
                        "error, the codes do not bracket the reference's Hadamard output",
    "rope": "the dimensions RoPE leaves alone are the reference's within the roundings and the rotated tail's "
            "energy is the reference's within them ({measured}), but it is not the reference's rotation",
    "orthogonal": "the values' energy is the reference's RoPE output's within the quantization error ({measured}), "
                  "and no other differing row's, but they are no inverse Hadamard of it",
    "scale": "the values are the reference's RoPE output times one constant per record, within the roundings",
    "normalized": "undone back to RMSNorm's output the values' RMS is 1 within the quantization error ({measured}), "
                  "but they are not the reference's",
    "none": "the values pass none of these checks (codes around the quantizer's input, an inverse transform, a "
            "kept energy, norm or constant)",
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


def _unroped(values: np.ndarray, positions: np.ndarray, rope_dim: int) -> np.ndarray:
    """The values with the reference's (2i, 2i+1) rotation of the tail at ``positions`` reversed, in binary64."""
    out = np.array(values, dtype=np.float64)
    if rope_dim == 0:
        return out
    angle = np.asarray(positions, dtype=np.float64)[..., None] * rope_frequencies(rope_dim).astype(np.float64)
    tail = out[..., out.shape[-1] - rope_dim:]
    x, y = tail[..., 0::2].copy(), tail[..., 1::2].copy()
    tail[..., 0::2], tail[..., 1::2] = x * np.cos(angle) + y * np.sin(angle), y * np.cos(angle) - x * np.sin(angle)
    return out


def _ratio(measured: np.ndarray, reference: np.ndarray, error: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(measured / reference, error / reference) per row: what a headline states of a fit within a bound."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return measured / reference, error / reference


def _normalized(unroped: np.ndarray, weight: np.ndarray | None, gaps: np.ndarray):
    """Per row: divided by the norm weight the values have RMS 1 within their error bound ``gaps``; and
    (their RMS, its allowed deviation)."""
    nothing = np.zeros(unroped.shape[:-1], dtype=bool), np.full(unroped.shape[:-1], np.nan), np.zeros(
        unroped.shape[:-1])
    if weight is None:
        return nothing
    w = np.abs(np.asarray(weight, dtype=np.float64))
    if not (w > 0).all():
        return nothing
    n = unroped.shape[-1]
    bound = _norm(gaps / w) + BF16_SLACK * np.sqrt(n)
    norm = _norm(unroped / w)
    rms, allowed = _ratio(norm, np.sqrt(n), bound)
    return np.abs(norm - np.sqrt(n)) <= bound, rms, allowed


def _fp4_rows(device, before_rope, after_rope, hadamard, rope_dim: int, scale_fit: bool, weight=None,
              positions=None) -> np.ndarray:
    """(rule, fitted constant, measured) of each FP4 row [rows, W]: quantizer, hadamard-inverse, rope, orthogonal,
    scale, normalized or none; ``measured`` maps a rule fitted within a bound to (its measure per row as a
    multiple of the reference's, the bound the same way)."""
    head = device.shape[-1] - rope_dim
    gaps = _half_gaps(device, FP4)
    target = _norm(after_rope)
    error = _norm(gaps) + BF16_SLACK * target
    inverse = _inverse_hadamard(device)
    rule = np.full(device.shape[:-1], "none", dtype=object)
    c = np.full(device.shape[:-1], np.nan)
    measured = {}
    if positions is not None:
        normalized, *measured["normalized"] = _normalized(_unroped(inverse, positions, rope_dim), weight, gaps)
    else:
        normalized = np.zeros(rule.shape, dtype=bool)
    rule[normalized] = "normalized"
    if scale_fit:
        x = after_rope.astype(np.float64)
        c = (inverse * x).sum(axis=-1) / np.maximum((x * x).sum(axis=-1), 1e-300)
        # the roundings scale with the constant: a record of (near) zeros is no multiple of anything
        bound = _norm(gaps) + BF16_SLACK * np.abs(c) * target
        rule[(_norm(inverse - c[..., None] * x) <= bound) & (np.abs(c) * target > bound)] = "scale"
    energy = _norm(device)
    energy_kept = np.abs(energy - target) <= error
    measured["orthogonal"] = _ratio(energy, target, error)
    # energy is evidence only where it tells this row's reference apart from the other differing rows'
    references = np.sort(target.reshape(-1))
    near = (np.searchsorted(references, energy + error, side="right")
            - np.searchsorted(references, energy - error, side="left"))
    energy_kept &= near <= 1  # its own reference row only
    rule[energy_kept & ~normalized] = "orthogonal"
    rule[energy_kept & normalized] = "none"  # another pool or another transform: nothing tells them apart
    head_matches = _norm(inverse[..., :head] - before_rope[..., :head]) <= error
    tail, reference_tail = _norm(inverse[..., head:]), _norm(before_rope[..., head:])
    energy = np.abs(tail - reference_tail) <= error
    measured["rope"] = _ratio(tail, reference_tail, error)
    rule[head_matches & energy] = "rope"
    rule[_norm(inverse - after_rope) <= error] = "hadamard-inverse"
    rule[_brackets(device, hadamard, FP4).all(axis=-1)] = "quantizer"
    return rule, c, measured


def _fp8_rows(device, normalized, rotated, rope_dim: int, weight=None, positions=None) -> np.ndarray:
    """(rule, fitted constant, measured) of each FP8 record [rows, W]: quantizer, rope, scale, normalized or none
    (``measured`` as _fp4_rows's)."""
    head = device.shape[-1] - rope_dim
    brackets = _brackets(device[..., :head], normalized[..., :head], FP8).all(axis=-1)
    tail_same = (device[..., head:].view(np.uint32) == rotated[..., head:].view(np.uint32)).all(axis=-1)
    tail, device_tail = _norm(rotated[..., head:]), _norm(device[..., head:])
    energy = np.abs(device_tail - tail) <= BF16_SLACK * tail
    measured = {"rope": _ratio(device_tail, tail, BF16_SLACK * tail)}
    x, d = normalized.astype(np.float64), device.astype(np.float64)
    c = (d[..., :head] * x[..., :head]).sum(axis=-1) / np.maximum((x[..., :head] ** 2).sum(axis=-1), 1e-300)
    fitted = c[..., None] * x
    blocks = np.abs(fitted[..., :head]).reshape(fitted.shape[:-1] + (-1, FP8_BLOCK)).max(axis=-1)
    floor = np.repeat(blocks * 2.0**-10, FP8_BLOCK, axis=-1)
    scaled = (np.abs(d[..., :head] - fitted[..., :head]) <= 2.0**-3 * np.abs(fitted[..., :head]) + floor).all(-1)
    scaled &= np.abs(device_tail - np.abs(c) * tail) <= BF16_SLACK * np.abs(c) * tail + 1e-30
    scaled &= (c != 0) & (d[..., :head] != 0).any(axis=-1)  # a record of zeros is no multiple of anything
    rule = np.full(device.shape[:-1], "none", dtype=object)
    if positions is not None:
        gaps = np.concatenate([_half_gaps(device[..., :head], FP8), np.zeros(device.shape[:-1] + (rope_dim,))], -1)
        normalized, *measured["normalized"] = _normalized(_unroped(device, positions, rope_dim), weight, gaps)
        rule[normalized] = "normalized"
    rule[scaled] = "scale"
    rule[brackets & energy] = "rope"
    rule[brackets & tail_same] = "quantizer"
    return rule, c, measured


def consistent(stage: str, rule: str, factor: float = 1.0) -> tuple[str, ...]:
    """The sub-steps whose difference the fit ``rule`` cannot tell apart, in the stage's order: a difference at
    any of them (an earlier one smaller than the later roundings) gives bytes that fit so, and always the last,
    the quantization whose codes set the bounds; the pool's, also the rows streamed into the carry that it
    reads."""
    found = _consistent(stage, rule, factor)
    if found and SUB_STEPS[stage][-1] not in found:  # every bound is the device's own codes' gaps: a quantization
        found += SUB_STEPS[stage][-1:]  # done another way (a coarser scale, another rounding) stays within them
    return ((STREAMED,) + found) if "pool" in found else found


def _consistent(stage: str, rule: str, factor: float) -> tuple[str, ...]:
    steps = SUB_STEPS[stage]
    if rule == "none":
        return ()
    if rule == "rope":  # the head within the roundings, the tail's energy kept: anything up to RoPE (FP4: a
        # butterfly that touched only the tail would look the same through the inverse Hadamard)
        return steps[:steps.index("RoPE" if stage == "compression_update" else "Hadamard") + 1]
    if rule == "orthogonal":  # the row's energy kept, its direction not: a rotation, the Hadamard, a reordering,
        # or norm weights applied to the wrong elements (near-uniform weights keep the energy too)
        return steps[steps.index("RMSNorm"):] if "RMSNorm" in steps else steps
    if rule == "normalized":  # still RMS 1 within the quantization error: a few values moved anywhere keep it
        return steps
    if rule == "scale" and abs(factor - 1) > FAR_FROM_ONE:
        # the tail scales with the head: the normalization, or (FP4) a scale after it
        return ("RMSNorm",) + (() if stage == "compression_update" else steps[steps.index("Hadamard"):])
    return steps  # within one rounding step of the quantizer's input: every sub-step


def _record_chain(stage: str, g: StepGeometry, inputs: Mapping[str, np.ndarray]):
    """(normalized, rotated, hadamard or None, block starts, norm weight) of every record the step emits, the
    reference's sub-steps."""
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
    return normalized, rotated, hadamard, np.asarray(block_starts), norm


def _computed_here(records: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Per differing device record [n, W]: not, bit for bit, one of the reference's records (all of which differ
    from it at its own place, so a match is another place's) and free of the runner's poison and guard-band bytes.
    The others were computed right and written at another record's offset, not written (whole or in part), or
    copied from outside a buffer: no sub-step's arithmetic differs there, so the fit judges only these."""
    filled = (poisoned(records) | guarded(records)).any(axis=-1)  # no computed record holds a run of fill bytes

    def whole(rows: np.ndarray) -> np.ndarray:
        rows = np.ascontiguousarray(unsigned(rows)).reshape(-1, rows.shape[-1])
        return rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[-1]))).ravel()

    return ~filled & ~np.isin(whole(records), whole(expected))


def _records(stage: str, g: StepGeometry, inputs, reference: Mapping, device: Mapping):
    """(tensor, rules of the differing new records, their differing elements, all differing elements)."""
    tensor = "present_index_key" if stage == "index_key_update" else "present_compressed_kv"
    expected, actual = np.asarray(reference[tensor]), np.asarray(device[tensor])
    past = int(inputs[BY_NAME[stage].inputs[4]].shape[1])
    if expected.shape != actual.shape or expected.dtype != actual.dtype:
        return None
    differ = differing_bits(expected, actual)
    if expected.ndim != 3 or expected.shape[1] <= past or not expected.size:  # no record completed in this step
        return None
    new = differ[:, past:]
    rows = np.argwhere(new.any(axis=-1))
    rows = rows[_computed_here(actual[:, past:][rows[:, 0], rows[:, 1]], expected)]
    if not rows.size:
        return None
    chain = _record_chain(stage, g, inputs)
    if chain is None:
        return None
    normalized, rotated, hadamard, block_starts, weight = chain
    picked = actual[:, past:][rows[:, 0], rows[:, 1]]
    positions = block_starts[rows[:, 1]]
    if stage == "index_key_update":
        values = decode_fp4_record(picked)
        judged = _fp4_rows(values, normalized[rows[:, 0], rows[:, 1]], rotated[rows[:, 0], rows[:, 1]],
                           hadamard[rows[:, 0], rows[:, 1]], g.rope_dim, scale_fit=True, weight=weight,
                           positions=positions)
    else:
        values = decode_fp8_record(picked) if actual.dtype == np.uint8 else np.asarray(picked, dtype=np.float32)
        judged = _fp8_rows(values, normalized[rows[:, 0], rows[:, 1]], rotated[rows[:, 0], rows[:, 1]], g.rope_dim,
                           weight, positions)
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
    """The sub-step consistency finding for a multi-step stage's differing records or query rows (None
    elsewhere): the sub-steps its bytes are consistent with, none named."""
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
    tensor, (rules, factors, measured), counts, differing, where = found
    steps = SUB_STEPS[stage]
    tally = {rule: int((rules == rule).sum()) for rule in REASONS if (rules == rule).any()}
    matched = {rule: n for rule, n in tally.items() if rule != "none"}
    rule = max(matched, key=lambda r: matched[r]) if matched and max(matched.values()) >= tally.get("none", 0) \
        else "none"
    chosen = rules == rule
    factor = float(np.median(factors[chosen])) if rule == "scale" else 1.0
    sets = {consistent(stage, r, float(np.median(factors[rules == r])) if r == "scale" else 1.0) for r in matched}
    # every matched row's sub-steps: one bug behind every record leaves only the sub-steps they share
    shared = [step for step in steps if all(step in found for found in sets)] if sets else []
    possible = list(consistent(stage, rule, factor))
    unit = "query rows" if stage == "index_query_finalize" else "records"
    order = " → ".join(steps)
    reason = REASONS[rule].replace("per record", f"per record (× {factor:.4g})") if rule == "scale" else REASONS[rule]
    if "{measured}" in reason:
        reason = reason.format(measured=_measured(*(np.asarray(m)[chosen] for m in measured[rule])))
    if rule == "none":
        headline = (f"no sub-step's output could be matched ({order}): in {int(chosen.sum()):,} of {len(rules):,} "
                    f"differing {unit} {reason}")
    else:
        computed = [step for step in possible if step in steps]
        listed = _listing(computed)
        within = rule in ("quantizer", "hadamard-inverse", "rope") or (rule == "scale" and len(computed) == len(steps))
        what = (f"differences within one rounding step of the {listed} output" if within else
                f"a difference at {listed}")
        if STREAMED in possible:
            what += f", or in {STREAMED} that the pool reads"
        headline = (f"in {int(chosen.sum()):,} of {len(rules):,} differing {unit} {reason}: consistent with {what} "
                    f"({order}); not separable from this stage's payload, no sub-step observed")
    evidence = {"sub_step": None, "sub_steps": list(steps), "consistent": possible, "shared": shared,
                "method": "intermediates", "rule": rule, unit.replace(" ", "_"): len(rules),
                "verdicts": tally, "first": list(where[int(np.argmax(chosen))]), "support": int(chosen.sum())}
    if rule == "scale":
        evidence["factor"] = factor
    # every differing attention record kept the reference's bf16 RoPE tail: nothing acting in RoPE differs
    evidence["rope_exact"] = stage == "compression_update" and bool((rules == "quantizer").all())
    # values moved far (another orthogonal transform, a constant far from 1): the sub-step re-runs are tried first
    evidence["structural"] = rule == "orthogonal" or (rule == "scale" and abs(factor - 1) > FAR_FROM_ONE)
    return Finding(SUB_STEP, stage, tensor, headline, int(counts[chosen].sum()), differing, evidence, FIT)


def _measured(ratios: np.ndarray, bounds: np.ndarray) -> str:
    """'measured 0.74-0.79x the reference's, the bound ±31%': what a fit within a bound rests on, stated."""
    ratios, bounds = ratios[np.isfinite(ratios)], bounds[np.isfinite(bounds)]
    if not ratios.size:
        return "no measure"
    low, high = f"{ratios.min():.2f}", f"{ratios.max():.2f}"
    span = low if low == high else f"{low}–{high}"
    return f"measured {span}× the reference's, the bound ±{bounds.max():.0%}" if bounds.size else f"measured {span}×"


def _listing(steps: list[str]) -> str:
    """'RMSNorm', 'RMSNorm or RoPE', 'pool, bf16, RMSNorm or RoPE'."""
    return steps[0] if len(steps) == 1 else ", ".join(steps[:-1]) + " or " + steps[-1]
