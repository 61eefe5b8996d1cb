"""Index-query finalization: bf16, RoPE of the tail at the query's position,
Hadamard, FP4 round trip — the transform scoring applies to every query head."""

from __future__ import annotations

import numpy as np

from csa_conform.errors import invalid
from csa_conform.numerics.bf16 import bf16_round
from csa_conform.numerics.fp4 import FP4_BLOCK, quantize_fp4_blocks
from csa_conform.numerics.hadamard import hadamard_bf16
from csa_conform.numerics.rope import compressed_rope
from csa_conform.numerics.variant import REFERENCE, Numerics


def fp4_round_trip(values, numerics: Numerics = REFERENCE) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Block-32 FP4 of values[..., W]: (scales[..., W/32], nibbles[..., W/32, 16], dequantized[..., W])."""
    values = np.asarray(values, dtype=np.float32)
    width = values.shape[-1]
    if width % FP4_BLOCK:
        raise invalid(f"FP4 index width {width} must be divisible by {FP4_BLOCK}")
    blocks = values.reshape(values.shape[:-1] + (width // FP4_BLOCK, FP4_BLOCK))
    scales, packed, dequantized = quantize_fp4_blocks(blocks, numerics)
    numerics.probe("fp4_scale", scales)
    numerics.probe("fp4_codes", packed)
    return scales, packed, dequantized.reshape(values.shape)


def finalize_index_query(q, rope_dim: int, position, numerics: Numerics = REFERENCE) -> np.ndarray:
    """q[..., 128] with `position` broadcast over the leading shape."""
    query = bf16_round(q, numerics)
    numerics.probe("bf16", query)
    width = query.shape[-1]
    if rope_dim > width:
        raise invalid("index query RoPE width exceeds index head dimension")
    query[..., width - rope_dim :] = compressed_rope(query[..., width - rope_dim :], position, numerics)
    numerics.probe("rope", query[..., width - rope_dim :])
    transformed = hadamard_bf16(query, numerics)
    numerics.probe("hadamard", transformed)
    return fp4_round_trip(transformed, numerics)[2]
