"""Quantization conventions, per block: the E8M0 scale exponent of a packed record off by a step.

The reference's exponent is ceil(log2f(amax / max_code)) with amax floored;
floor(...)+1 agrees everywhere except where amax / max_code is an exact power
of two, a truncating or flooring port is one low almost everywhere, and a
floor placed after the division moves only the tiny blocks. A scale byte off
by the same step in every block where it differs, checked against the
oracle's own block inputs (amax / max_code a power of two or not), says which.
"""

from __future__ import annotations

import numpy as np

from csa_conform.explain.patterns.findings import SCALE_EXPONENT, Context, Finding, spans
from csa_conform.numerics.fp4 import FP4_BLOCK
from csa_conform.numerics.fp8 import FP8_BLOCK
from csa_conform.numerics.records import FP4_RECORD_BYTES, FP8_BLOCKS, FP8_RECORD_BYTES

# record width -> (bytes per block, blocks, max code, amax floor, the oracle trace key of the block inputs)
FORMATS = {
    FP8_RECORD_BYTES: (FP8_BLOCK + 1, FP8_BLOCKS, 448.0, 1.0e-4, "FP8 E4M3 block input"),
    FP4_RECORD_BYTES: (FP4_BLOCK // 2 + 1, FP4_RECORD_BYTES // (FP4_BLOCK // 2 + 1), 6.0, 6.0 * 2.0**-126,
                       "FP4 E2M1 block input"),
}


def _powers_of_two(context: Context, key: str, shape: tuple, floor: float, target: float) -> np.ndarray | None:
    """Per (b, record, block) of the new records: amax / max_code is an exact power of two (None: no trace)."""
    blocks = context.trace().get(key)
    if not blocks:
        return None
    x = np.asarray(blocks[0], dtype=np.float32)
    if x.ndim != 4 or x.shape[0] != shape[0] or x.shape[2] != shape[2]:
        return None
    amax = np.abs(np.where(np.isfinite(x), x, 0)).max(axis=-1)
    quotient = (np.maximum(amax, np.float32(floor)) / np.float32(target)).astype(np.float32)
    bits = quotient.view(np.uint32)
    return ((bits & 0x7FFFFF) == 0) & (((bits >> 23) & 0xFF) > 0)


def scale_exponent(stage: str, tensor: str, expected, actual, differ, axes, context: Context) -> Finding | None:
    if expected.dtype != np.uint8 or expected.ndim != 3 or expected.shape[-1] not in FORMATS:
        return None
    block_bytes, blocks, target, floor, key = FORMATS[expected.shape[-1]]
    offsets = np.arange(blocks) * block_bytes
    steps = actual[..., offsets].astype(np.int64) - expected[..., offsets].astype(np.int64)
    changed = steps != 0
    if not changed.any():
        return None
    values = sorted({int(v) for v in steps[changed]})
    block_of = np.minimum(np.arange(expected.shape[-1]) // block_bytes, blocks)
    inside = np.concatenate([changed, np.zeros(changed.shape[:-1] + (1,), bool)], axis=-1)[..., block_of]
    covered = int(np.count_nonzero(differ & inside))
    differing = int(np.count_nonzero(differ))
    count = int(np.count_nonzero(changed))
    evidence = {"blocks": count, "steps": values, "records": spans(np.flatnonzero(changed.any(axis=(0, 2))))}
    step_text = (f"{abs(values[0])} {'too large' if values[0] > 0 else 'too small'}" if len(values) == 1
                 else f"off by {', '.join(map(str, values))}")
    headline = f"the E8M0 scale exponent is {step_text} in {count:,} block{'s' if count != 1 else ''} of {tensor}"
    past = context.inputs.get("past_index_key" if stage == "index_key_update" else "past_compressed_kv")
    first_new = int(np.asarray(past).shape[1]) if past is not None else 0
    powers = _powers_of_two(context, key, (expected.shape[0], 0, blocks), floor, target)
    if powers is not None and powers.shape[1] == expected.shape[1] - first_new:
        new_changed = changed[:, first_new:]
        at_power = int(np.count_nonzero(new_changed & powers))
        all_powers = int(np.count_nonzero(powers))
        evidence.update(power_of_two=at_power, power_of_two_blocks=all_powers,
                        elsewhere=int(np.count_nonzero(new_changed & ~powers)))
        if at_power == count and at_power == all_powers:
            headline += (f", exactly the {at_power:,} blocks whose amax/{target:g} is a power of two "
                         "(ceil(log2) computed as floor(log2)+1, or a round-up at exact powers)")
        elif at_power == count:
            headline += f", all where amax/{target:g} is a power of two ({at_power:,} of {all_powers:,} such blocks)"
        else:
            headline += f" ({at_power:,} of them where amax/{target:g} is a power of two)"
    headline += f"; the block's codes follow ({covered:,} of {differing:,} differing bytes)"
    return Finding(SCALE_EXPONENT, stage, tensor, headline, covered, differing, evidence)
