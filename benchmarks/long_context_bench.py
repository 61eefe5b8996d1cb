"""The oracle at long context, before vs after, side by side: one step of the `long` suite per case.

Run by hand, never asserted in tests:

    python benchmarks/long_context_bench.py --before REF [--repeat N]

(REF 0343f64 is main before the long-context oracle work.)

Cases (the first step of each `long` recipe, numba engine): (a) ratio-4 decode
at T = 2^20, N = I = 64, top-k 512; (b) ratio-128 FP8 decode at 2^20, N = 64;
(c) ratio-128 f32 decode at 2^20, N = 64; (d) a ratio-4 prefill of S = 8192
tokens from position 0, N = I = 64, top-k 512, from the tie-free prefill
recipe (long_context.prefill_spec; too large for a golden at N = 64). The
steps' inputs are built once by this tree and saved under build/long-bench/;
each tree ("after": this one, "before": a detached worktree of REF) then
runs every step in a fresh process, the trees interleaved, the median of
--repeat runs, reporting wall time, the process's peak resident memory (VmHWM)
and that peak less the resident memory before the step, the bytes of the
step's inputs and returned payloads (what any oracle holds when it returns;
a view counts as its base, once) and the peak beyond them and the imported
modules (the working memory this oracle adds), and their sum less the
inputs (the oracle's own: what the step adds to what it was given), the process's CPU time (all
threads: less sensitive than wall time to other load on the machine), and
each stage's time (and CPU time) with its G mul-add/s (index scoring: S x
causal records x I x 128; attention: S x N x C x 512, twice: scores and
values), and their sum over the
no-FMA peak, a lower bound on the step's time. The no-FMA peak is
measured here: independent binary32 multiply-then-add chains held in
registers, numba, fastmath off (its assembly checked: no fused op), one
thread per core, the best of five runs. Targets on 2 cores: (a) <= 0.15 s and
<= 0.5 GB, (b) and (c) <= 30 ms, (d) <= 10 s and <= 2 GB of the oracle's own
(no oracle of the contract can hold (d) in 2 GB whole: its inputs and its
output Y alone are 2.35 GiB).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from before_tree import before_tree

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "build" / "long-bench"
CASES = {
    "a": ("long.r4-n64-t1048576", "ratio-4 decode T=2^20 N=64 I=64 k=512"),
    "b": ("long.r128-fp8-n64-t1048576", "ratio-128 fp8 decode T=2^20 N=64"),
    "c": ("long.r128-f32-n64-t1048576", "ratio-128 f32 decode T=2^20 N=64"),
    "d": (None, "ratio-4 prefill S=8192 from 0 N=64 I=64 k=512 (tie-free recipe)"),
}
CHILD = "--child"


def build_inputs() -> None:
    """Save each case's first step (attrs, outputs, inputs) as this tree's recipes build it."""
    from csa_conform.golden.recipes import long_context, suite_recipes
    from csa_conform.golden.recipes.stream import assemble

    DATA.mkdir(parents=True, exist_ok=True)
    for name, (case_id, _) in CASES.items():
        target = DATA / f"{name}.npz"
        if target.exists():
            continue
        if case_id is None:
            plan = long_context.long_plan(long_context.prefill_spec(heads=64), seed=0, weights_seed=0)
        else:
            (recipe,) = suite_recipes("long", 0, case_id)
            plan = recipe.build(recipe.seed)
        inputs = assemble(plan, plan.steps[0], plan.initial_state)
        header = json.dumps({"attrs": plan.attrs, "outputs": list(plan.output_names)})
        np.savez(target, header=np.array(header), **inputs)


def _resident_kib(field: str) -> int:
    status = Path("/proc/self/status").read_text()
    return int(status.split(f"{field}:")[1].split()[0])


def child(case: str) -> None:
    """One step in this process (the tree on PYTHONPATH): prints a JSON line of timings and memory."""
    from csa_conform.oracle import run_step, stage_functions
    from csa_conform.spec import PIPELINE

    baseline = _resident_kib("VmRSS")
    data = np.load(DATA / f"{case}.npz")
    header = json.loads(str(data["header"]))
    inputs = {name: data[name] for name in data.files if name != "header"}
    attrs, outputs = header["attrs"], header["outputs"]
    run_step(attrs, inputs, outputs)  # compile or load the numba cache, warm up
    stage_seconds: dict[str, float] = {}
    stage_cpu: dict[str, float] = {}
    for stage in PIPELINE:
        original = stage_functions.STAGE_FUNCTIONS[stage.name]

        def timed(run, original=original, name=stage.name):
            begin, begin_cpu = time.perf_counter(), time.process_time()
            payload = original(run)
            stage_seconds[name] = time.perf_counter() - begin
            stage_cpu[name] = time.process_time() - begin_cpu
            return payload

        stage_functions.STAGE_FUNCTIONS[stage.name] = timed
    before = _resident_kib("VmRSS")
    begin, begin_cpu = time.perf_counter(), time.process_time()
    result = run_step(attrs, inputs, outputs)
    wall, cpu = time.perf_counter() - begin, time.process_time() - begin_cpu
    peak = _resident_kib("VmHWM")
    held = _held_bytes([*inputs.values(), *(t for p in result.stages.values() for t in _built(p).values())])
    work = _work(attrs, inputs, result)
    print(json.dumps({
        "wall": wall, "peak_mib": peak / 1024, "step_mib": (peak - before) / 1024,
        "held_mib": held / 2**20, "working_mib": (peak - baseline) / 1024 - held / 2**20,
        "inputs_mib": _held_bytes(inputs.values()) / 2**20,
        "cpu": cpu, "stages": stage_seconds, "stage_cpu": stage_cpu, "work": work, "tree": str(Path(stage_functions.__file__).parents[2]),
    }))


def _built(payload) -> dict:
    """A payload's tensors without building a deferred one (reading logical_records at 2^20 decodes
    512 MiB); a tree from before StagePayload.built is read through its private dict."""
    if isinstance(payload, dict):
        return payload
    built = getattr(payload, "built", None)
    return built() if built else payload._tensors


def _held_bytes(arrays) -> int:
    """Bytes of the distinct buffers behind the step's inputs and returned payloads (a broadcast or
    other view counts as its base once): what any oracle must hold when it returns."""
    buffers = {}
    for array in arrays:
        base = np.asarray(array)
        while isinstance(base.base, np.ndarray):
            base = base.base
        buffers[id(base)] = base.nbytes
    return sum(buffers.values())


def _work(attrs, inputs, result) -> dict[str, float]:
    """Multiply-adds of the stages that are dot products, from the step's own payloads (attention's
    from its valid candidates, each scored and summed for every head: reading its scores of a long
    prefill would recompute them, 1.25 GiB)."""
    stages = result.stages
    work = {}
    if "index_scoring" in stages:
        scores = np.asarray(stages["index_scoring"]["scores"])
        work["index_scoring"] = float(np.isfinite(scores).sum()) * attrs["index_num_heads"] * 128
    candidates = np.asarray(stages["candidate_assembly"]["candidates"])
    work["sparse_sink_softmax_attention"] = float(np.count_nonzero(candidates >= 0)) * attrs["num_heads"] * 512 * 2
    return work


CHAIN_STEPS = 16  # mul-then-add steps per lane between its load and store: the loop unrolls them (32 did not)
FUSED = re.compile(r"\bvfn?m(?:add|sub)")


def no_fma_peak(seconds: float = 0.5) -> float:
    """G mul-add/s of independent binary32 multiply-then-add chains on every core, the best of five runs.

    Eight chains per loop iteration, each a vector of lanes held in
    registers for CHAIN_STEPS steps between one load and one store, so
    neither latency nor stores bound it (a chain loaded and stored every
    step is store-bound: about 8 mul-adds a cycle on this machine's AVX-512
    against 16). fastmath is off, so nothing fuses; its assembly is checked
    for fused multiply-adds.
    """
    from numba import njit

    @njit(nogil=True, fastmath=False, cache=False)
    def chains(lanes, factor, addend, repeats):
        part = lanes.size // 8
        for _ in range(repeats):
            for lane in range(part):
                x0, x1, x2, x3 = lanes[lane], lanes[lane + part], lanes[lane + 2 * part], lanes[lane + 3 * part]
                x4, x5 = lanes[lane + 4 * part], lanes[lane + 5 * part]
                x6, x7 = lanes[lane + 6 * part], lanes[lane + 7 * part]
                for _ in range(CHAIN_STEPS):
                    x0 = x0 * factor + addend
                    x1 = x1 * factor + addend
                    x2 = x2 * factor + addend
                    x3 = x3 * factor + addend
                    x4 = x4 * factor + addend
                    x5 = x5 * factor + addend
                    x6 = x6 * factor + addend
                    x7 = x7 * factor + addend
                lanes[lane], lanes[lane + part], lanes[lane + 2 * part], lanes[lane + 3 * part] = x0, x1, x2, x3
                lanes[lane + 4 * part], lanes[lane + 5 * part] = x4, x5
                lanes[lane + 6 * part], lanes[lane + 7 * part] = x6, x7
        return lanes

    size = 256
    cores = os.cpu_count() or 1
    buffers = [np.ones(size, dtype=np.float32) for _ in range(cores)]
    chains(buffers[0], np.float32(0.5), np.float32(0.5), 1)
    if any(FUSED.search(assembly) for assembly in chains.inspect_asm().values()):
        raise SystemExit("no_fma_peak: the chains compiled to fused multiply-adds")
    repeats = 1
    while True:
        begin = time.perf_counter()
        chains(buffers[0], np.float32(0.5), np.float32(0.5), repeats)
        if time.perf_counter() - begin > seconds / 10:
            break
        repeats *= 2
    best = 0.0
    with ThreadPoolExecutor(cores) as pool:
        for _ in range(5):
            begin = time.perf_counter()
            list(pool.map(lambda lanes: chains(lanes, np.float32(0.5), np.float32(0.5), repeats), buffers))
            best = max(best, cores * size * CHAIN_STEPS * repeats / (time.perf_counter() - begin) / 1e9)
    return best


def _own_mib(run: dict) -> float:
    """What the step adds to its inputs: the payloads it returns and the working memory beyond them
    (target (d)'s 2 GB; the inputs and Y alone are 2.35 GiB at S = 8192, N = 64)."""
    return run.get("held_mib", float("nan")) - run.get("inputs_mib", float("nan")) + run.get("working_mib", float("nan"))


def run_child(tree: Path, case: str) -> dict:
    environment = dict(os.environ, PYTHONPATH=str(tree), CSA_CONFORM_ENGINE="numba")
    result = subprocess.run([sys.executable, __file__, CHILD, case], capture_output=True, text=True, env=environment)
    if result.returncode != 0:
        raise SystemExit(f"{tree} case {case} failed:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="git ref of the 'before' oracle, e.g. 0343f64")
    parser.add_argument("--repeat", type=int, default=3, help="runs per tree; the median is reported")
    parser.add_argument("--cases", default="".join(CASES), help="which cases, e.g. 'ab'")
    options = parser.parse_args()
    reference = options.before
    build_inputs()
    trees = {"before": before_tree(reference, "long-bench-before"), "after": ROOT}
    peak = no_fma_peak()
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; no-FMA peak {peak:.1f} G mul-add/s; "
          f"before = {reference[:12]}")
    for case in options.cases:
        runs: dict[str, list[dict]] = {label: [] for label in trees}
        for _ in range(options.repeat):
            for label, tree in trees.items():
                runs[label].append(run_child(tree, case))
        middle = {label: sorted(found, key=lambda run: run["wall"])[(len(found) - 1) // 2] for label, found in runs.items()}
        print(f"({case}) {CASES[case][1]}: after/before {middle['after']['wall'] / middle['before']['wall']:.3f} "
              f"(medians of {options.repeat}; load average now {os.getloadavg()[0]:.1f})")
        work = sum(middle["after"]["work"].values())
        print(f"    {work:.3g} mul-adds: {work / peak / 1e9 * 1e3:.1f} ms at the no-FMA peak (a lower bound)")
        for label in trees:
            run = middle[label]
            fastest = min(found["wall"] for found in runs[label])
            stages = ", ".join(
                f"{stage} {seconds * 1e3:.1f} ms" + (
                    f" ({run['work'][stage] / seconds / 1e9:.1f} G/s, {run['work'][stage] / seconds / 1e9 / peak:.0%})"
                    if stage in run["work"] and seconds > 0 else "")
                for stage, seconds in run["stages"].items() if seconds >= 5e-4
            )
            print(f"    {label:<6} {run['wall']:7.3f} s (min {fastest:.3f}, cpu {run['cpu']:.3f} s)  "
                  f"peak {run['peak_mib']:6.0f} MiB (step {run['step_mib']:+6.0f}; inputs and returned payloads "
                  f"{run.get('held_mib', float('nan')):.0f}, working memory beyond them "
                  f"{run.get('working_mib', float('nan')):+.0f}; the oracle's own, payloads and working memory: "
                  f"{_own_mib(run):.0f})  {stages}")
            print(f"           cpu s by stage: " + ", ".join(
                f"{stage} {seconds:.3f}" for stage, seconds in run["stage_cpu"].items() if seconds >= 5e-4))

if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == CHILD:
        child(sys.argv[2])
    else:
        main()
