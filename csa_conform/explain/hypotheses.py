"""The numeric causes `explain` tries, as numerics variants of the oracle.

A hypothesis swaps one ingredient of the reference's arithmetic: one libm
function, correctly rounded ((float)f((double)x) with the host's double
function), or the device's own: CUDA's binary32 function, or its double
function rounded once (what a kernel writing `(float)exp((double)x)` gets),
both evaluated on the GPU on the same arguments; fused multiply-adds in the reductions
(acc = fma(a, b, acc) in the same order) or in the a*b±c*d pairs of the
compressed RoPE (every pair, or the sums only); flush-to-zero of subnormals; the FP8/FP4 block-scale
exponent from the device's log2f. Each stage is tried only with the
ingredients it contains (its ``libm`` and ``fusions`` in csa_conform.spec).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from csa_conform.numerics.variant import (
    ACCUMULATE,
    PAIRS_FIRST,
    PAIRS_SECOND,
    SUMS_FIRST,
    SUMS_SECOND,
    Numerics,
    Tally,
)
from csa_conform.spec import BY_NAME, FLOAT_STAGES


FUSION_NAMES = {
    ACCUMULATE: "FMA accumulation (acc = fma(a, b, acc), same order)",
    PAIRS_FIRST: "a*b±c*d contracted as fma(a, b, ±c*d)",
    PAIRS_SECOND: "a*b±c*d contracted as fma(±c, d, a*b)",
    SUMS_FIRST: "a*b+c*d (sums only) contracted as fma(a, b, c*d)",
    SUMS_SECOND: "a*b+c*d (sums only) contracted as fma(c, d, a*b)",
}


def _guarded(function: Callable[..., float]) -> Callable[..., float]:
    def evaluate(*args: float) -> float:
        try:
            return function(*args)
        except OverflowError:
            return math.inf
        except ValueError:
            return math.nan
    return evaluate


def _exp(x: float) -> float:
    return 0.0 if x == -math.inf else _guarded(math.exp)(x)


def _log2(x: float) -> float:
    if x == 0:
        return -math.inf
    return math.inf if x == math.inf else _guarded(math.log2)(x)


def _pow(x: float, y: float) -> float:
    return float(np.power(np.float64(x), np.float64(y))) if not (math.isfinite(x) and math.isfinite(y)) else \
        _guarded(math.pow)(x, y)


_DOUBLE = {"expf": _exp, "sinf": _guarded(math.sin), "cosf": _guarded(math.cos), "log2f": _log2, "powf": _pow}


def correctly_rounded(name: str) -> Callable:
    """(float)f((double)x) with the host's double libm (glibc), elementwise over binary32 arrays."""
    scalar = _DOUBLE[name]
    arity = 2 if name == "powf" else 1
    universal = np.frompyfunc(lambda *args: scalar(*(float(arg) for arg in args)), arity, 1)

    def evaluate(*args):
        arrays = [np.asarray(arg, dtype=np.float32) for arg in args]
        with np.errstate(all="ignore"):
            return np.asarray(universal(*arrays), dtype=np.float64).astype(np.float32)
    return evaluate


@dataclass(frozen=True)
class Hypothesis:
    """A named ingredient swap; ``numerics(tallies)`` is the variant that applies it."""

    key: str
    name: str
    libm: tuple[tuple[str, Callable], ...] = ()
    block_scale: Callable | None = None
    fused: frozenset[str] = frozenset()
    ftz: bool = False

    def numerics(self, tallies: dict[str, Tally] | None = None, trace: dict | None = None) -> Numerics:
        return Numerics(dict(self.libm), self.block_scale, self.fused, self.ftz, tallies, trace)

    def combine(self, other: Hypothesis) -> Hypothesis:
        return Hypothesis(f"{self.key}+{other.key}", f"{self.name} + {other.name}", self.libm + other.libm,
                          self.block_scale or other.block_scale, self.fused | other.fused, self.ftz or other.ftz)


def stage_hypotheses(stage: str, device_libm: Callable[[str], Callable] | None) -> list[Hypothesis]:
    """Every single-ingredient hypothesis for a stage (device-libm ones only with a device)."""
    found = []
    for name in BY_NAME[stage].libm:
        where = "E8M0 block-scale log2f" if name == "log2f" else name
        found.append(Hypothesis(f"{name}:correctly-rounded", f"{where} correctly rounded",
                                libm=((name, correctly_rounded(name)),)))
        if device_libm is not None:
            double = f"(float){name[:-1]}((double)x) on the device"
            if name == "log2f":
                found.append(Hypothesis("log2f:device", "E8M0 block-scale exponent from the device's log2f",
                                        block_scale=device_libm(name)))
                found.append(Hypothesis("log2f:device-double", f"E8M0 block-scale exponent from {double}",
                                        block_scale=device_libm(name + "-double")))
            else:
                found.append(Hypothesis(f"{name}:device", f"{name} from the device's libm",
                                        libm=((name, device_libm(name)),)))
                found.append(Hypothesis(f"{name}:device-double", f"{name} as {double}",
                                        libm=((name, device_libm(name + "-double")),)))
    for fused in BY_NAME[stage].fusions:
        found.append(Hypothesis(f"fma:{fused}", FUSION_NAMES[fused], fused=frozenset({fused})))
    if stage in FLOAT_STAGES:
        found.append(Hypothesis("ftz", "flush-to-zero of subnormal inputs and results", ftz=True))
    return found
