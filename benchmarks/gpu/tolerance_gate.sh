#!/usr/bin/env bash
# On CUDA: the official-numerics tolerance gate on the ci suite.
# generate --profile official -> calibrate -> diff --tolerance must exit 0 for the built-in kernels on the GPU
# (and under --backend host) and for the --force-host all control run, and exit 1 for a kernel with the sink
# left out of the softmax denominator. Run from the repository root; results under $OUT. About 2-3 minutes.
set -u
export PYTHONPATH=$PWD
OUT=${OUT:-$(mktemp -d)}
PY=${PY:-python3}
status=0
check() {  # check NAME EXPECTED_EXIT command...
    local name=$1 expected=$2; shift 2
    "$@" > "$OUT/$name.txt" 2>&1
    local code=$?
    local verdict=ok; [ "$code" -eq "$expected" ] || { verdict=WRONG; status=1; }
    echo "$name: exit $code (expected $expected) $verdict; $(grep '^envelope:' "$OUT/$name.txt" | tail -1)"
}
$PY -m csa_conform generate --suite ci --profile official -o "$OUT/off.h5" --force -q || exit 2
$PY -m csa_conform calibrate "$OUT/off.h5" -o "$OUT/tol.toml" --force || exit 2
check cuda-builtin 0 $PY -m csa_conform diff "$OUT/off.h5" --tolerance "$OUT/tol.toml" -q
check host-builtin 0 $PY -m csa_conform diff "$OUT/off.h5" --backend host --tolerance "$OUT/tol.toml" -q
check control-force-host-all 0 $PY -m csa_conform diff "$OUT/off.h5" --force-host all --tolerance "$OUT/tol.toml" -q
rm -rf "$OUT/missing-sink" && cp -r kernels "$OUT/missing-sink"
$PY - "$OUT/missing-sink/block_quant.cuh" <<'PATCH'
import sys
from pathlib import Path
path = Path(sys.argv[1])
old = "denominator = denominator + csa_expf(a.sink[r.head] - maximum);"
text = path.read_text()
assert text.count(old) == 1, "the sink line is not in block_quant.cuh once"
path.write_text(text.replace(old, "denominator = denominator + 0.0f;"))
PATCH
check cuda-missing-sink 1 $PY -m csa_conform diff "$OUT/off.h5" --kernels "$OUT/missing-sink" --tolerance "$OUT/tol.toml" -q
grep -h "^selection/\|^sparse_sink_softmax_attention/Y\|^not compared" "$OUT"/cuda-builtin.txt "$OUT"/cuda-missing-sink.txt
exit $status
