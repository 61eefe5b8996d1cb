"""Rust's `Display` for f32, which the reference's error messages embed.

Shortest round-trip digits, never an exponent (`1e-7` prints as
`0.0000001`, `2^126` as 38 digits), `NaN`, `inf` and `-inf`.
"""

from __future__ import annotations

import numpy as np


def rust_display_f32(value) -> str:
    value = np.float32(value)
    if np.isnan(value):
        return "NaN"
    if np.isinf(value):
        return "inf" if value > 0 else "-inf"
    return np.format_float_positional(value, unique=True, trim="-")
