#!/usr/bin/env bash
# whole-ci `diff --explain` of three buggy kernels on the GPU (CUDA backend): the run's exit code
# is the diff's (1), no explanation is `failed`, and each run's wall time (the target: <= 60 s per buggy kernel).
# Writes $OUT/k38-explain.json (per bug: seconds, exit code, verdict tally, headlines) and prints a summary.
set -u
# run from the repository root (the merged tree)
OUT="${OUT:-/tmp/k38-out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD"
timeout 290 python3 - "$OUT" <<'PY'
import json, os, shutil, subprocess, sys, tempfile, time
from pathlib import Path
out = Path(sys.argv[1])
BUGS = {
    "fp8_subnormals_flushed": ("block_quant.cuh", "        code = (unsigned int)rintf(magnitude * 512.0f);",
                               "        code = 0u;"),
    "fp4_prescaled": ("block_quant.cuh",
                      "__device__ void quantize_fp4_e2m1_block(const float* in, unsigned char* scale, unsigned char* packed)\n{\n",
                      "__device__ void quantize_fp4_e2m1_block(const float* in_raw, unsigned char* scale, unsigned char* packed)\n{\n"
                      "    float scaled[32];\n    for (int i = 0; i < 32; ++i) scaled[i] = in_raw[i] * 0.1f;\n    const float* in = scaled;\n"),
    "sink_doubled": ("block_quant.cuh", "denominator = denominator + csa_expf(a.sink[r.head] - maximum);",
                     "denominator = denominator + 2.0f * csa_expf(a.sink[r.head] - maximum);"),
}
results = {}
work = Path(tempfile.mkdtemp(prefix="k38-"))
for name, (file, old, new) in BUGS.items():
    kernels = work / name
    shutil.copytree("kernels", kernels)
    text = (kernels / file).read_text()
    assert text.count(old) == 1, name
    (kernels / file).write_text(text.replace(old, new))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "csa_conform", "diff", "goldens/ci.h5", "--kernels", str(kernels),
                           "--explain", "--json", "-q"], capture_output=True, text=True)
    seconds = time.perf_counter() - started
    try:
        document = json.loads(done.stdout)
    except json.JSONDecodeError:
        document = {}
    explanations = document.get("explain", {}).get("explanations", [])
    tally = document.get("explain", {}).get("summary", {})
    results[name] = {"seconds": round(seconds, 1), "exit": done.returncode, "tally": tally,
                     "failed": [e["headline"] for e in explanations if e["verdict"] == "failed"],
                     "headlines": sorted({e["headline"].split("]: ", 1)[-1][:400] for e in explanations
                                          if e["verdict"] != "inherited"})[:12],
                     "stderr": done.stderr[-400:]}
    print(f"{name}: {seconds:.1f} s, exit {done.returncode} (want 1), failed explanations "
          f"{len(results[name]['failed'])} (want 0), tally {tally}", flush=True)
(out / "k38-explain.json").write_text(json.dumps(results, indent=1))
PY
