#!/usr/bin/env bash
# Python stage providers judged like kernels, on a GPU.
# Run from the repository root (merged tree); results under $OUT; about 3-4 minutes on one H100/H200.
#  1. The CuPy provider of the built-in kernels vs the native CUDA backend on every ci case, chained and
#     isolated, and on a planted-bug kernel directory: same verdicts, same results document apart from the
#     kernel description (chained: the two documents compared here; isolated and the planted bug: the
#     cuda-marked tests of tests/providers/test_builtin_provider.py).
#  2. The PyTorch official-numerics provider on the GPU: calibrate the envelope from the official profile on
#     ci (isolated, the default), diff inside it (expect exit 0) and the sink left out (expect exit 1); gap
#     against the NumPy official profile per stage (how far the GPU implementation sits from it).
#     CHAINED=1 also calibrates chained and diffs chained (about a minute more); PROD=1 does the isolated
#     check on the prod suite (generate + calibrate on 16 cores: several minutes more).
#  3. bench per stage on the torch provider (CUDA events) on ci, --time-diverged (its stages 4, 5 and 7 are
#     the official numerics, not the reference's, so they are timed marked untrusted).
set -u
OUT=${OUT:-./gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PY:-python3}
CLI="$PY -m csa_conform"
CUPY=python:examples/providers/builtin_kernels.py:CupyBuiltinKernels
TORCH=python:examples/providers/torch_official.py:TorchOfficial
NOSINK=python:examples/providers/torch_official.py:TorchOfficialWithoutSink
status() { echo "== $1: exit $2 (expected $3)"; }

$PY -c "import torch, cupy; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'cupy', cupy.__version__)"

echo "== 1. CuPy provider of the built-in kernels vs the native backend"
timeout 170 $PY -m pytest tests/providers/test_builtin_provider.py -m cuda -k "isolated or planted" -q -p no:cacheprovider -rs \
  2>&1 | tee "$OUT/cupy-vs-native.pytest.txt" | tail -5
$CLI diff goldens/ci.h5 --json > "$OUT/native.json"; n=$?
$CLI diff goldens/ci.h5 --kernels $CUPY --json > "$OUT/cupy.json"; c=$?
status "native diff" $n 0; status "cupy provider diff" $c 0
$PY - "$OUT/native.json" "$OUT/cupy.json" <<'EOF'
import json, sys
native, cupy = (json.load(open(path)) for path in sys.argv[1:])
def strip(value):
    if isinstance(value, dict):
        return {key: strip(item) for key, item in value.items()
                if key not in ("time_s", "reproduce", "kernel", "argv", "kernels", "options", "elapsed_s")}
    if isinstance(value, list):
        return [strip(item) for item in value]
    return value
same = strip(native) == strip(cupy)
print("documents equal apart from the kernel description and times:", same)
if not same:
    for a, b in zip(native["cases"], cupy["cases"]):
        if strip(a) != strip(b):
            print("first differing case:", a["case"]); break
EOF

echo "== 2. torch official-numerics provider on the GPU (ci)"
$CLI calibrate goldens/ci.h5 -o "$OUT/envelope.toml" --force
$CLI diff goldens/ci.h5 --kernels $TORCH --tolerance "$OUT/envelope.toml" > "$OUT/torch-inside.txt"; t=$?
status "torch official inside the envelope" $t 0; grep -A16 "^tolerance" "$OUT/torch-inside.txt"
head -3 "$OUT/torch-inside.txt"
$CLI diff goldens/ci.h5 --kernels $NOSINK --tolerance "$OUT/envelope.toml" > "$OUT/torch-nosink.txt"; s=$?
status "torch official without the sink" $s 1; grep -E " NO |^envelope" "$OUT/torch-nosink.txt"
$CLI generate --suite ci --profile official --case 'random.r4-n*' -o "$OUT/official-small.h5" --force > /dev/null
timeout 90 $CLI explain "$OUT/official-small.h5" --kernels $NOSINK > "$OUT/torch-nosink-explain.txt"
echo "explain of the sink left out against official goldens (random.r4-n*):"
grep -A4 "^EXPLANATIONS" "$OUT/torch-nosink-explain.txt" | cut -c1-500; tail -1 "$OUT/torch-nosink-explain.txt"
timeout 60 $CLI diff "$OUT/official-small.h5" --kernels $TORCH -q > "$OUT/torch-vs-official-small.txt"; o=$?
status "torch official bit-exact against the official profile's goldens (random.r4-n*)" $o "0 if torch's CUDA exp rounds as glibc's on these, else 1"
$CLI gap goldens/ci.h5 --profile official --mode isolated --kernels $TORCH --markdown > "$OUT/torch-gap.md"
echo "gap: NumPy official profile -> torch on the GPU (isolated), per stage:"; cat "$OUT/torch-gap.md"

if [ "${CHAINED:-0}" = 1 ]; then
  echo "== 2a. chained: an envelope calibrated chained, and the torch provider chained inside it"
  $CLI calibrate goldens/ci.h5 --mode chained -o "$OUT/envelope-chained.toml" --force
  $CLI diff goldens/ci.h5 --kernels $TORCH --tolerance "$OUT/envelope-chained.toml" > "$OUT/torch-chained.txt"; k=$?
  status "torch official inside the chained envelope" $k 0; grep -E "^tolerance| NO |^envelope" "$OUT/torch-chained.txt"
fi

if [ "${PROD:-0}" = 1 ]; then
  echo "== 2b. prod suite"
  $CLI generate --suite prod -o "$OUT/prod.h5" --jobs 3 --force > /dev/null
  $CLI calibrate "$OUT/prod.h5" -o "$OUT/envelope-prod.toml" --force
  $CLI diff "$OUT/prod.h5" --kernels $TORCH --tolerance "$OUT/envelope-prod.toml" > "$OUT/torch-prod.txt"; p=$?
  status "torch official inside the prod envelope" $p 0; grep -A16 "^tolerance" "$OUT/torch-prod.txt"
fi

echo "== 3. bench per stage on the torch provider (CUDA events; its official-numerics stages are timed untrusted)"
timeout 90 $CLI bench goldens/ci.h5 --kernels $TORCH --case 'random.r4-n*' --time-cap 0.5 --time-diverged \
  --json > "$OUT/torch-bench.json"; b=$?
status "bench" $b "1: the official numerics diverge from the reference goldens; timed with --time-diverged"
$PY - "$OUT/torch-bench.json" <<'EOF'
import json, sys
section = json.load(open(sys.argv[1]))["bench"]
print("timer", section["timer"], "|", section["caveat"])
for case in section["cases"][:4]:
    for row in case["rows"]:
        print(f"{case['case']:28} {row['row']:52} {row['status']:10} "
              + (f"median {row['median_s'] * 1e3:.4f} ms n={row['samples']}" if "median_s" in row else ""))
EOF
