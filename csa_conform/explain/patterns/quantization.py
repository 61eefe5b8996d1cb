"""Quantization conventions, per block: the E8M0 scale exponent of a packed record, or of the index query's
FP4 round trip, off by a step.

The reference's exponent is ceil(log2f(amax / max_code)) with amax floored;
floor(...)+1 (or frexpf's exponent) agrees everywhere except where amax /
max_code is an exact power of two, a truncating or flooring port is one low
almost everywhere, and a floor placed after the division moves only the tiny
blocks. A scale byte off by a step is claimed only where the oracle's own
block input quantized at that exponent is the device's codes bit for bit in
every block whose scale moved (a value scaled before the quantization moves
the exponent as well, but no exponent makes its codes the reference
input's); the blocks' amax / max_code, a power of two or not, says which
convention. The query keeps no scale byte (its payload is the
dequantized values), so there a block counts as off by a step when the
oracle's own block input quantized at that exponent is the device's block bit
for bit.
"""

from __future__ import annotations

import numpy as np

from csa_conform.explain.patterns.findings import DECISIVE, MIN_SUPPORT, SCALE_EXPONENT, Context, Finding, spans
from csa_conform.numerics.blockscale import block_power
from csa_conform.numerics.e8m0 import power_of_two
from csa_conform.numerics.fp4 import AMAX_FLOOR, E2M1_MAX, FP4_BLOCK, e2m1_decode, e2m1_encode
from csa_conform.numerics.fp8 import E4M3_MAX, FP8_BLOCK, e4m3_encode
from csa_conform.numerics.records import FP4_RECORD_BYTES, FP8_BLOCKS, FP8_RECORD_BYTES

# record width -> (bytes per block, blocks, max code, amax floor, the oracle trace key of the block inputs)
FORMATS = {
    FP8_RECORD_BYTES: (FP8_BLOCK + 1, FP8_BLOCKS, 448.0, 1.0e-4, "FP8 E4M3 block input"),
    FP4_RECORD_BYTES: (FP4_BLOCK // 2 + 1, FP4_RECORD_BYTES // (FP4_BLOCK // 2 + 1), 6.0, 6.0 * 2.0**-126,
                       "FP4 E2M1 block input"),
}


QUERY_STEPS = (-2, -1, 1, 2)  # exponent steps a query block is tried at


def _amax(x: np.ndarray, floor: float) -> np.ndarray:
    """Each block's floored amax over its finite values, as the reference takes it."""
    return np.maximum(np.abs(np.where(np.isfinite(x), x, 0)).max(axis=-1), np.float32(floor)).astype(np.float32)


def _exact_powers(amax: np.ndarray, target: float) -> np.ndarray:
    """Per block: amax / max_code is an exact (normal) power of two."""
    bits = (amax / np.float32(target)).astype(np.float32).view(np.uint32)
    return ((bits & 0x7FFFFF) == 0) & (((bits >> 23) & 0xFF) > 0)


def _power_text(at_power: int, count: int, all_powers: int, target: float) -> str:
    """What the changed blocks' amax says: exactly the power-of-two blocks moved, all of them lie there, or how
    many do."""
    if at_power == count and at_power == all_powers:
        return f", exactly the {at_power:,} blocks whose amax/{target:g} is a power of two"
    if at_power == count:
        return f", all where amax/{target:g} is a power of two ({at_power:,} of {all_powers:,} such blocks)"
    return f" ({at_power:,} of them where amax/{target:g} is a power of two)"


def _requantized(x: np.ndarray, power: np.ndarray, form: int) -> np.ndarray:
    """The code bytes of blocks x[..., width] at the given E8M0 exponents, as the reference packs them."""
    scale = power_of_two(np.clip(power, -126, 127))[..., None]
    with np.errstate(over="ignore"):  # a quotient past binary32 saturates, as the clip below would
        scaled = x / scale
    if form == FP8_RECORD_BYTES:
        return e4m3_encode(np.clip(scaled, -E4M3_MAX, E4M3_MAX).astype(np.float32))
    codes = e2m1_encode(np.clip(scaled, -E2M1_MAX, E2M1_MAX).astype(np.float32))
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def scale_exponent(stage: str, tensor: str, expected, actual, differ, axes, context: Context) -> Finding | None:
    """Blocks whose E8M0 byte is off by a step and whose codes are the oracle's own block input quantized at that
    exponent, bit for bit: claimed only when that requantization reproduces every block whose scale moved
    (the other blocks are the reference's), accounts for the tensor, and rests on at least MIN_SUPPORT bytes.
    A block input scaled before the quantization moves the exponent too, but its codes are not the
    reference's input's at any exponent."""
    if expected.dtype != np.uint8 or expected.ndim != 3 or expected.shape[-1] not in FORMATS:
        return None
    block_bytes, blocks, target, floor, key = FORMATS[expected.shape[-1]]
    offsets = np.arange(blocks) * block_bytes
    steps = actual[..., offsets].astype(np.int64) - expected[..., offsets].astype(np.int64)
    changed = steps != 0
    if not changed.any():
        return None
    past = context.inputs.get("past_index_key" if stage == "index_key_update" else "past_compressed_kv")
    first_new = int(np.asarray(past).shape[1]) if past is not None else 0
    trace = context.trace().get(key)
    if not trace or changed[:, :first_new].any():  # nothing to requantize: past records are copies
        return None
    x = np.asarray(trace[0], dtype=np.float32)
    new_records = expected.shape[1] - first_new
    if x.shape != (expected.shape[0], new_records, blocks, x.shape[-1]) or not new_records:
        return None
    codes = actual[:, first_new:, :blocks * block_bytes].reshape(expected.shape[0], new_records, blocks,
                                                                  block_bytes)[..., 1:]
    power = block_power(_amax(x, floor), target)
    requantized = _requantized(x, power + steps[:, first_new:], expected.shape[-1])
    reproduced = (requantized == codes).all(axis=-1)
    if not reproduced[changed[:, first_new:]].all():
        return None
    values = sorted({int(v) for v in steps[changed]})
    block_of = np.minimum(np.arange(expected.shape[-1]) // block_bytes, blocks)
    inside = np.concatenate([changed, np.zeros(changed.shape[:-1] + (1,), bool)], axis=-1)[..., block_of]
    covered = int(np.count_nonzero(differ & inside))
    differing = int(np.count_nonzero(differ))
    if covered < DECISIVE * differing or covered < MIN_SUPPORT:
        return None
    count = int(np.count_nonzero(changed))
    evidence = {"blocks": count, "steps": values, "records": spans(np.flatnonzero(changed.any(axis=(0, 2)))),
                "support": covered}
    step_text = (f"{abs(values[0])} {'too large' if values[0] > 0 else 'too small'}" if len(values) == 1
                 else f"off by {', '.join(map(str, values))}")
    headline = f"the E8M0 scale exponent is {step_text} in {count:,} block{'s' if count != 1 else ''} of {tensor}"
    powers = _exact_powers(_amax(x, floor), target)
    new_changed = changed[:, first_new:]
    at_power = int(np.count_nonzero(new_changed & powers))
    all_powers = int(np.count_nonzero(powers))
    evidence.update(power_of_two=at_power, power_of_two_blocks=all_powers,
                    elsewhere=int(np.count_nonzero(new_changed & ~powers)))
    headline += _power_text(at_power, count, all_powers, target)
    headline += (f"; quantized at that exponent the oracle's block inputs are the device's codes bit for bit "
                 f"({covered:,} of {differing:,} differing bytes)")
    return Finding(SCALE_EXPONENT, stage, tensor, headline, covered, differing, evidence)


def _fp4_at(x: np.ndarray, power: np.ndarray) -> np.ndarray:
    """x[..., 32] through the reference's FP4 round trip at the given E8M0 exponents (one per block)."""
    scale = power_of_two(np.clip(power, -126, 127))[..., None]
    return e2m1_decode(e2m1_encode(np.clip(x / scale, -E2M1_MAX, E2M1_MAX))) * scale


def query_scale_exponent(stage: str, tensor: str, expected, actual, differ, axes, context: Context) -> Finding | None:
    """The index query's FP4 round trip at another E8M0 exponent: each differing block is the oracle's block
    input quantized at the reference's exponent plus a step, bit for bit (claimed only where that accounts for
    the tensor; its support is the blocks, one exponent each)."""
    if stage != "index_query_finalize" or expected.dtype != np.float32 or expected.shape[-1] % FP4_BLOCK:
        return None
    blocks = context.trace().get("FP4 E2M1 block input")
    shape = expected.shape[:-1] + (expected.shape[-1] // FP4_BLOCK, FP4_BLOCK)
    if not blocks or np.size(blocks[0]) != expected.size:
        return None
    x = np.asarray(blocks[0], dtype=np.float32).reshape(shape)
    amax = _amax(x, AMAX_FLOOR)
    power = block_power(amax, E2M1_MAX)
    device = actual.reshape(shape).view(np.uint32)
    changed = differ.reshape(shape).any(axis=-1)
    steps = np.zeros(changed.shape, dtype=np.int64)
    with np.errstate(all="ignore"):
        for step in QUERY_STEPS:
            fits = changed & (steps == 0) & (_fp4_at(x, power + step).view(np.uint32) == device).all(axis=-1)
            steps[fits] = step
    moved = steps != 0
    count = int(np.count_nonzero(moved))
    covered = int(np.count_nonzero(differ.reshape(shape) & moved[..., None]))
    differing = int(np.count_nonzero(differ))
    if covered < DECISIVE * differing or covered < MIN_SUPPORT:  # a block another bug moved may land on a coarser
        return None  # grid by chance
    values = sorted({int(v) for v in steps[moved]})
    powers = _exact_powers(amax, E2M1_MAX)
    at_power, all_powers = int(np.count_nonzero(moved & powers)), int(np.count_nonzero(powers))
    rows = np.flatnonzero(moved.reshape(int(np.prod(shape[:2])), -1).any(axis=-1))
    step_text = (f"{abs(values[0])} {'too large' if values[0] > 0 else 'too small'}" if len(values) == 1
                 else f"off by {', '.join(map(str, values))}")
    headline = (f"the E8M0 scale exponent of the index query's FP4 round trip is {step_text} in {count:,} "
                f"block{'s' if count != 1 else ''} of {tensor}" + _power_text(at_power, count, all_powers, 6.0)
                + f"; quantized at that exponent the reference's blocks are the device's bit for bit ({covered:,} "
                f"of {differing:,} differing elements)")
    evidence = {"blocks": count, "steps": values, "query_rows": spans(rows), "power_of_two": at_power,
                "power_of_two_blocks": all_powers, "elsewhere": count - at_power, "support": covered,
                # log2f is exact at a power of two, so another libm's moves exponents only beside one: only
                # blocks all at exact powers are no numeric ingredient's doing
                "structural": at_power == count}
    return Finding(SCALE_EXPONENT, stage, tensor, headline, covered, differing, evidence)
