"""Unnormalised in-place Walsh–Hadamard butterfly, then bf16(x * 1/sqrt(n)).

Span order 1, 2, 4, ... with each a+b / a-b rounded in binary32, as the
reference's index path does before its FP4 round trip (a numerics variant may
write b - a for a - b, or leave the rotation out: explain's hypotheses of a
butterfly ported the other way or forgotten).
"""

from __future__ import annotations

import numpy as np

from csa_conform.errors import unsupported
from csa_conform.numerics.bf16 import bf16_round
from csa_conform.numerics.variant import REFERENCE, Numerics


def hadamard_bf16(x, numerics: Numerics = REFERENCE) -> np.ndarray:
    values = np.array(x, dtype=np.float32)
    width = values.shape[-1]
    if width == 0 or width & (width - 1):
        raise unsupported(f"Hadamard index width must be a power of two, got {width}")
    if numerics.hadamard_variant == "skipped":
        return values
    span = 1
    while span < width:
        pairs = values.reshape(values.shape[:-1] + (width // (2 * span), 2, span))
        left, right = pairs[..., 0, :].copy(), pairs[..., 1, :]
        with np.errstate(over="ignore", invalid="ignore"):
            pairs[..., 0, :] = left + right
            pairs[..., 1, :] = right - left if numerics.hadamard_variant == "difference-reversed" else left - right
        span *= 2
    scale = np.float32(1) / np.sqrt(np.float32(width))
    with np.errstate(over="ignore", invalid="ignore"):
        return bf16_round(values * scale, numerics)
