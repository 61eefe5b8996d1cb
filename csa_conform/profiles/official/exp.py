"""The exponential the official attention uses: glibc's expf (exact) or a model of the GPU's fast exp.

Whether V4's kernel build uses the exact or the approximate GPU exponential is
not settled, so the profile keeps it a switch. `exact` is glibc's binary32
expf (the reference's, within one ulp of exp). `fast` models `__expf`:
exp2 of the binary32 product x * log2(e), evaluated in float64 and rounded
once; the hardware's ex2.approx differs from it by a few ulp, which is
rounding, not a rule.
"""

from __future__ import annotations

import numpy as np

from csa_conform.numerics.libm import expf

EXP_CHOICES = ("exact", "fast")
_LOG2E = np.float32(np.log2(np.e))


def fast_expf(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.exp2((x * _LOG2E).astype(np.float64)).astype(np.float32)


def official_exp(choice: str):
    return expf if choice == "exact" else fast_expf
