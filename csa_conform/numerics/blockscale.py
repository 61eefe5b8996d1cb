"""E8M0-scaled block quantization shared by the FP8 and FP4 record formats.

The scale power is ceil(log2f(amax / max_code)) with glibc's `log2f`, which
decides the power at binade boundaries; codes are the format's own encoder
applied to x / 2^power clamped to the code range. The log2f is the active
numerics variant's (the reference's by default).
"""

from __future__ import annotations

import numpy as np

from csa_conform.errors import ContractError
from csa_conform.numerics.e8m0 import e8m0_encode, power_of_two
from csa_conform.numerics.rustfmt import rust_display_f32
from csa_conform.numerics.variant import REFERENCE, Numerics


def block_power(amax, target_max, numerics: Numerics = REFERENCE) -> np.ndarray:
    """ceil(log2f(amax / target_max)) as the E8M0 exponent, as the reference computes it."""
    quotient = np.asarray(amax, dtype=np.float32) / np.float32(target_max)
    return np.ceil(numerics.block_scale_log2(quotient)).astype(np.int64).reshape(quotient.shape)


def quantize_blocks(x, target_max, amax_floor, encode, decode, what: str, numerics: Numerics = REFERENCE):
    """Shared E8M0-scaled block quantizer; blocks along the last axis, batch axes in processing order.

    The reference quantizes block after block and stops at the first one that
    holds a non-finite input or whose code times scale overflows, so the first
    failing block in C order decides the message.
    """
    x = np.asarray(x, dtype=np.float32)
    numerics.record(f"{what} block input", x)
    finite = np.isfinite(x)
    safe = np.where(finite, x, np.float32(0))
    amax = np.abs(safe).max(axis=-1, initial=amax_floor)
    power = block_power(amax, target_max, numerics)
    scale = power_of_two(power)
    normalized = np.clip(safe / scale[..., None], -target_max, target_max)
    codes = encode(normalized, numerics=numerics)
    decoded = decode(codes)
    with np.errstate(over="ignore"):
        dequantized = numerics.dequantized(decoded * scale[..., None])
    _raise_first_failure(finite, decoded, scale, dequantized, what)
    return e8m0_encode(power), codes, dequantized


def _raise_first_failure(finite, decoded, scale, dequantized, what: str) -> None:
    non_finite = ~finite.all(axis=-1)
    overflow = ~np.isfinite(dequantized).all(axis=-1)
    failing = non_finite | overflow
    if not failing.any():
        return
    block = np.unravel_index(int(np.argmax(failing)), failing.shape)
    if non_finite[block]:
        raise ContractError(f"block dequantization: {what} input contains a non-finite value")
    element = int(np.argmax(~np.isfinite(dequantized[block])))
    raise ContractError(
        f"block dequantization: {what} value {rust_display_f32(decoded[block][element])} "
        f"overflows with block scale {rust_display_f32(scale[block])}"
    )
