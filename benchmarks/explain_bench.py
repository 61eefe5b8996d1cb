"""`explain` of one production-shape attention divergence, before and after the compiled correctly-rounded
libm, side by side in one run.

Run by hand, never asserted in tests. The step is the ratio-128 FP8 prefill
B1 S1024 N16 Kc1024 of oracle_bench.py (case a); the "device" payload is the oracle's
attention with expf correctly rounded ((float)exp((double)x), what a kernel
calling the double function gets), so explain must find that hypothesis.
"before" evaluates the correctly-rounded functions one element at a time in
Python (the former np.frompyfunc loop), "after" with the compiled ufuncs
(csa_conform.explain.rounded_libm); both stop at the first single that
reproduces. Timings are the best of --repeat, A and B interleaved. Target on
the 2-core CI machine: one prod-shape attention divergence explained in
<= 10 s.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from oracle_bench import RATIO128_FP8, THREE, step_inputs  # noqa: E402

from csa_conform.contract import validate_step  # noqa: E402
from csa_conform.diff import compare_payloads  # noqa: E402
from csa_conform.explain import EXPLAINED, explain_step  # noqa: E402
from csa_conform.explain import hypotheses, rounded_libm  # noqa: E402
from csa_conform.explain.stages import run_stage  # noqa: E402
from csa_conform.numerics.variant import Numerics, using  # noqa: E402
from csa_conform.oracle import run_step  # noqa: E402

STAGE = "sparse_sink_softmax_attention"


def _step(sequence: int):
    attrs = dict(RATIO128_FP8, num_heads=16)
    inputs, outputs = step_inputs(np.random.default_rng(1), attrs, 1, sequence, sequence, sequence), THREE
    g = validate_step(attrs, inputs, outputs)
    expected = run_step(attrs, inputs, outputs).stages
    with using(Numerics({"expf": rounded_libm.correctly_rounded("expf")})):  # the same bits, compiled
        device = dict(expected, **{STAGE: run_stage(STAGE, g, inputs, expected)})
    return g, inputs, expected, device


def _explain(g, inputs, expected, device, libm) -> tuple[float, str]:
    hypotheses.correctly_rounded = libm
    diffs = [diff for diff in compare_payloads({STAGE: expected[STAGE]}, {STAGE: device[STAGE]}) if not diff.passed]
    started = time.perf_counter()
    explanation = explain_step("bench", 0, STAGE, g, inputs, expected, device, diffs, None, {})
    seconds = time.perf_counter() - started
    assert explanation.verdict == EXPLAINED, explanation.headline()
    return seconds, explanation.cause.key


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequence", type=int, default=1024, help="query rows and kv length (default 1024)")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    g, inputs, expected, device = _step(args.sequence)
    sides = {"before (elementwise)": rounded_libm.elementwise, "after (compiled)": rounded_libm.correctly_rounded}
    best = {name: float("inf") for name in sides}
    for _ in range(args.repeat):
        for name, libm in sides.items():
            seconds, cause = _explain(g, inputs, expected, device, libm)
            best[name] = min(best[name], seconds)
    for name, seconds in best.items():
        print(f"{name:22s} {seconds:8.2f} s  (cause {cause})")
    before, after = best.values()
    print(f"after / before: {after / before:.3f}")


if __name__ == "__main__":
    main()
