"""`explain` before vs after, side by side in one run: one production-shape attention divergence (explained,
and one nothing reproduces) and the explain of one ci case with a porting bug.

    python benchmarks/explain_bench.py [--before REF] [--repeat N]

Run by hand, never asserted in tests. "before" is a detached worktree of REF
(default 952a4ed, main before this work), "after" this tree; each
measurement runs in a fresh child process with that tree first on
sys.path, A and B interleaved, best of --repeat.

- prod-explained: the ratio-128 FP8 prefill B1 S1024 N16 Kc1024 of
  oracle_bench.py (case a); the "device" attention is the oracle's with expf
  correctly rounded ((float)exp((double)x)), so explain must name that
  hypothesis. Timed: explain_step of the attention divergence.
- prod-unexplained: the same step, the "device" attention computed with
  every head's sink one ulp larger: no ingredient reproduces it, so every
  single and every combination runs. Timed: explain_step.
- ci-case: `csa-conform explain goldens/ci.h5 --backend host --case
  boundaries.r4-prefill-5` with the sink-inside-the-max porting bug
  (tests/kernels_mutants/diagnosis_mutants.py) in a copy of each side's own
  kernels, the whole process (start, host-emulation build, both replays, the
  explanation).

Targets on the 2-core CI machine: one prod-shape attention divergence
explained in <= 10 s; explain of one ci case <= 10 s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from before_tree import before_tree

ROOT = Path(__file__).resolve().parents[1]
CHILD = "--child"
STAGE = "sparse_sink_softmax_attention"
CI_CASE = "boundaries.r4-prefill-5"
SCENARIOS = ("prod-explained", "prod-unexplained", "ci-case")


def _prod_step(sequence: int):
    import numpy as np

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from oracle_bench import RATIO128_FP8, THREE, step_inputs

    from csa_conform.contract import validate_step
    from csa_conform.oracle import run_step

    attrs = dict(RATIO128_FP8, num_heads=16)
    inputs = step_inputs(np.random.default_rng(1), attrs, 1, sequence, sequence, sequence)
    g = validate_step(attrs, inputs, THREE)
    return g, inputs, run_step(attrs, inputs, THREE).stages


def _child(scenario: str, sequence: int) -> dict:
    """One measurement in this process (the tree on sys.path is the side measured)."""
    import numpy as np

    from csa_conform.compare.bitwise import compare_payloads
    from csa_conform.explain import explain_step
    from csa_conform.explain.rounded_libm import correctly_rounded
    from csa_conform.explain.stages import run_stage
    from csa_conform.numerics.variant import Numerics

    g, inputs, expected = _prod_step(sequence)
    if scenario == "prod-explained":
        device = run_stage(STAGE, g, inputs, expected, Numerics({"expf": correctly_rounded("expf")}))
    else:
        sink = np.nextafter(inputs["head_sink"], np.float32(np.inf)).astype(np.float32)
        device = run_stage(STAGE, g, dict(inputs, head_sink=sink), expected)
    actual = dict(expected, **{STAGE: device})
    diffs = [diff for diff in compare_payloads({STAGE: expected[STAGE]}, {STAGE: device}) if not diff.passed]
    started = time.perf_counter()
    explanation = explain_step("bench", 0, STAGE, g, inputs, expected, actual, diffs, None, {})
    seconds = time.perf_counter() - started
    trials = len(explanation.trials)
    return {"seconds": seconds, "verdict": explanation.verdict, "trials": trials,
            "cause": explanation.cause.key if explanation.cause else None}


def _ci_case(tree: Path, kernels: Path) -> dict:
    environment = dict(os.environ, PYTHONPATH=str(tree))
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "csa_conform", "explain", str(ROOT / "goldens" / "ci.h5"),
                             "--backend", "host", "--kernels", str(kernels), "--case", CI_CASE, "--json"],
                            capture_output=True, text=True, env=environment, cwd=tree)
    seconds = time.perf_counter() - started
    document = json.loads(result.stdout)["explain"]
    return {"seconds": seconds, "verdict": str(document["summary"]),
            "trials": sum(len(e.get("trials", [])) for e in document["explanations"]), "cause": None}


def _measure(tree: Path, scenario: str, sequence: int, kernels: Path) -> dict:
    if scenario == "ci-case":
        return _ci_case(tree, kernels)
    environment = dict(os.environ, PYTHONPATH=str(tree))
    result = subprocess.run([sys.executable, __file__, CHILD, scenario, str(sequence)], capture_output=True,
                            text=True, env=environment, cwd=tree)
    if result.returncode:
        raise SystemExit(f"{scenario} in {tree} failed: {result.stderr[-2000:]}")
    return json.loads(result.stdout.splitlines()[-1])


def _mutant_kernels(tree: Path) -> Path:
    """The bug patched into that tree's own kernels (the kernel ABI moves with the tree)."""
    sys.path.insert(0, str(ROOT / "tests" / "kernels_mutants"))
    from diagnosis_mutants import DIAGNOSED

    bug = next(bug for bug in DIAGNOSED if bug.name == "sink_inside_the_max")
    return bug.mutant.apply(tree / "kernels", Path(tempfile.mkdtemp(prefix="explain-bench-")) / "kernels")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="952a4ed", help="git ref of the 'before' tree (default 952a4ed)")
    parser.add_argument("--sequence", type=int, default=1024, help="query rows and kv length (default 1024)")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--scenario", action="append", choices=SCENARIOS, help="default: all")
    options = parser.parse_args()
    trees = {"before": before_tree(options.before, "explain-bench-before"), "after": ROOT}
    kernels = {side: _mutant_kernels(tree) for side, tree in trees.items()}
    print(f"before = {options.before}, after = {ROOT}; best of {options.repeat}, A and B interleaved")
    for scenario in options.scenario or SCENARIOS:
        best: dict[str, dict] = {}
        for _ in range(options.repeat):
            for side, tree in trees.items():
                found = _measure(tree, scenario, options.sequence, kernels[side])
                if side not in best or found["seconds"] < best[side]["seconds"]:
                    best[side] = found
        for side, found in best.items():
            print(f"{scenario:17s} {side:6s} {found['seconds']:7.2f} s  {found['verdict']}, "
                  f"{found['trials']} trials, cause {found['cause']}")
        print(f"{scenario:17s} after/before {best['after']['seconds'] / best['before']['seconds']:.3f}")


if __name__ == "__main__":
    if sys.argv[1:2] == [CHILD]:
        print(json.dumps(_child(sys.argv[2], int(sys.argv[3]))))
    else:
        main()
