"""The compressed RoPE of the reference (base 160000, YaRN-style ramp, factor 16).

Frequencies, angles and rotations are binary32 with glibc's `powf`, `sinf`
and `cosf`; each rotated pair is rounded through bfloat16. The libm and the
a*b±c*d pairs come from the active numerics variant (the reference's by default).
"""

from __future__ import annotations

import numpy as np

from csa_conform.errors import invalid
from csa_conform.numerics.bf16 import bf16_round
from csa_conform.numerics.variant import REFERENCE, Numerics

ROPE_BASE = np.float32(160_000.0)
ROPE_FACTOR = np.float32(16.0)
RAMP_LOW = np.float32(15.0)
RAMP_HIGH = np.float32(25.0)


def rope_frequencies(rope_dim: int, numerics: Numerics = REFERENCE) -> np.ndarray:
    """f32 frequency of each (2j, 2j+1) pair, in the reference's operation order."""
    pair = np.arange(rope_dim // 2, dtype=np.float32)
    ramp = np.clip((pair - RAMP_LOW) / (RAMP_HIGH - RAMP_LOW), np.float32(0), np.float32(1))
    exponent = -(np.float32(2) * pair) / np.float32(rope_dim)
    base = numerics.powf(np.full_like(exponent, ROPE_BASE), exponent)
    one = np.float32(1)
    return numerics.pair(base, one - ramp, base / ROPE_FACTOR, ramp)


def compressed_rope(tail, positions, numerics: Numerics = REFERENCE) -> np.ndarray:
    """Rotate tail[..., even] by the compressed RoPE at `positions` (broadcast over the leading shape)."""
    tail = np.asarray(tail, dtype=np.float32)
    width = tail.shape[-1]
    if width == 0:
        return tail.copy()
    if width % 2:
        raise invalid("compressed RoPE tail width must be even")
    position = (np.asarray(positions).astype(np.int64) + numerics.rope_shift).astype(np.float32)[..., None]
    angle = position * rope_frequencies(width, numerics)
    numerics.record("rope angle", np.broadcast_to(angle, angle.shape))
    sin, cos = numerics.sinf(angle), numerics.cosf(angle)
    # (2i, 2i+1) pairs; a variant may pair (i, i + width/2) instead (the split-halves layout)
    first, second = (slice(0, width // 2), slice(width // 2, width)) if numerics.rope_split_halves else (
        slice(0, None, 2), slice(1, None, 2))
    real, imaginary = tail[..., first], tail[..., second]
    rotated = np.empty(np.broadcast_shapes(tail.shape, angle.shape[:-1] + (width,)), dtype=np.float32)
    pairs = numerics.pair(real, cos, imaginary, sin, -1), numerics.pair(real, sin, imaginary, cos, +1)
    for pair in pairs:
        numerics.record("rope output", pair)
    rotated[..., first], rotated[..., second] = (bf16_round(pair, numerics) for pair in pairs)
    return rotated
