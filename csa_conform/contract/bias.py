"""attention_bias: checked apart from validate_step, as the reference checks it late.

The bias shape is only known to fit once the candidates fix the score shape.
"""

from __future__ import annotations

import numpy as np

from csa_conform.contract.execute import require_dtype
from csa_conform.contract.messages import debug_shape
from csa_conform.errors import invalid, unsupported


def attention_bias(bias: np.ndarray, target: tuple[int, int, int, int]) -> np.ndarray:
    """The reference's additive bias: f32, rank <= 4, broadcast to scores [B, N, S, C].

    Checked only once the candidates are known, after the compression stages.
    """
    bias = np.asarray(bias)
    if bias.dtype == np.bool_:
        raise unsupported("boolean attention_bias semantics are deferred; use additive f32 bias")
    require_dtype("attention_bias", bias, "Float32")
    if bias.ndim > 4:
        raise invalid(f"attention_bias rank must be <= 4, got {debug_shape(bias.shape)}")
    padded = (1,) * (4 - bias.ndim) + bias.shape
    if any(extent not in (1, goal) for extent, goal in zip(padded, target)):
        raise invalid(
            f"attention_bias shape {debug_shape(bias.shape)} is not broadcastable to "
            f"{debug_shape(target)}"
        )
    return np.broadcast_to(bias.reshape(padded), tuple(target))
