#!/usr/bin/env bash
# whole-ci `diff --explain` of buggy kernels on the GPU (CUDA backend), one process each: the run's exit code
# is the diff's (1), no explanation is `failed`, and each run's wall time (the target: <= 60 s per buggy kernel,
# a fresh machine's first run included). The first bug runs twice: cold (empty NVRTC, driver and numba caches
# on a fresh machine), then warm. The slowest kinds on the host go first: a compressor's carry copy raced
# against its walk, the attention's logit dots in binary64, the sink's weight without the max shift, the APE
# row from the step's token index. A run starts only while it fits in BUDGET seconds.
# Writes $OUT/explain-wall.json (per run: seconds, exit code, verdict tally, headlines) and prints a line per run.
set -u
# run from the repository root
OUT="${OUT:-/tmp/explain-wall}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD"
timeout "${BUDGET:-540}" python3 - "$OUT" "${BUDGET:-540}" <<'PY'
import json, shutil, subprocess, sys, tempfile, time
from pathlib import Path

sys.path.insert(0, "tests/kernels_mutants")
from explain_mutants import EXPLAIN_BUGS

out, budget = Path(sys.argv[1]), float(sys.argv[2])
started_all = time.perf_counter()
PRELUDE = "block_quant.cuh"
BUGS = {
    "carry_copy_racing_the_walk": (
        "    if (threadIdx.x != 0) return;  // the walk writes records from `written` on, none the copy writes\n"
        "    for (long long i = 0; i < carry_floats; ++i) state[i] = past_state[i];\n",
        "    for (long long i = threadIdx.x; i < carry_floats; i += blockDim.x) state[i] = past_state[i];\n"
        "    if (threadIdx.x != 0) return;  // the walk writes records from `written` on, none the copy writes\n"),
    "sink_weight_unshifted": ("denominator = denominator + csa_expf(a.sink[r.head] - maximum);",
                              "denominator = denominator + csa_expf(a.sink[r.head]);"),
    "ape_row_from_step_token": ("ape[(long long)phase * width + d]", "ape[(long long)(token % ratio) * width + d]"),
    "fp8_subnormals_flushed": ("        code = (unsigned int)rintf(magnitude * 512.0f);", "        code = 0u;"),
}
work = Path(tempfile.mkdtemp(prefix="explain-wall-"))
directories = {}
for name, (old, new) in BUGS.items():
    kernels = work / name
    shutil.copytree("kernels", kernels)
    text = (kernels / PRELUDE).read_text()
    assert text.count(old) == 1, name
    (kernels / PRELUDE).write_text(text.replace(old, new))
    directories[name] = kernels
logit = next(bug for bug in EXPLAIN_BUGS if bug.name == "logit_binary64_accumulator")
directories[logit.name] = logit.apply(Path("kernels"), work / logit.name)

order = ["carry_copy_racing_the_walk", "carry_copy_racing_the_walk", logit.name, "sink_weight_unshifted",
         "ape_row_from_step_token", "fp8_subnormals_flushed"]
results = []
last = 60.0
for index, name in enumerate(order):
    left = budget - (time.perf_counter() - started_all)
    if left < 1.5 * last:
        print(f"{name}: not run ({left:.0f} s of the budget left)", flush=True)
        continue
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "csa_conform", "diff", "goldens/ci.h5", "--kernels",
                           str(directories[name]), "--explain", "--json", "-q"], capture_output=True, text=True)
    seconds = last = time.perf_counter() - started
    try:
        document = json.loads(done.stdout)
    except json.JSONDecodeError:
        document = {}
    explanations = document.get("explain", {}).get("explanations", [])
    tally = document.get("explain", {}).get("summary", {})
    run = "cold" if index == 0 else "warm" if order.index(name) != index else ""
    results.append({"bug": name, "run": run, "seconds": round(seconds, 1), "exit": done.returncode,
                    "diff_s": document.get("summary", {}).get("time_s"), "tally": tally,
                    "failed": [e["headline"] for e in explanations if e["verdict"] == "failed"],
                    "headlines": sorted({e["headline"].split("]: ", 1)[-1][:400] for e in explanations
                                         if e["verdict"] != "inherited"})[:12],
                    "stderr": done.stderr[-400:]})
    print(f"{name}{' (' + run + ')' if run else ''}: {seconds:.1f} s, exit {done.returncode} (want 1), failed "
          f"explanations {len(results[-1]['failed'])} (want 0), tally {tally}", flush=True)
    (out / "explain-wall.json").write_text(json.dumps(results, indent=1))
PY
