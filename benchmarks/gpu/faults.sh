#!/bin/bash
# On CUDA a sticky error (an illegal address, a trap, a misaligned store) and an endless loop are their case's
# verdict fault / hang, the other cases are judged, the run exits 1 (with --git-bisect too), no traceback.
# Run from the repository root; jsonschema's wheels installed from .whl/ by the caller. About 2-3 minutes.
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
python3 - <<'PY'
import shutil
from pathlib import Path
line = "    if ((int)blockIdx.x >= batch * sequence * heads) return;\n"
for name, plant in {"segv": "output[1LL << 40] = 1.0f;", "loop": "for (;;) { asm volatile(\"\"); }",
                    "trap": "__trap();", "misaligned": "*(float *)((char *)output + 2) = 1.0f;"}.items():
    target = Path(f"/tmp/k41-{name}")
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree("kernels", target)
    path = target / "csa_ratio128_attention.cu"
    path.write_text(path.read_text().replace(line, line + f"    if (batch == 2) {{ {plant} }}\n"))
PY
C="edges.r128-f32-ties-b*"   # b2n3 faults (batch 2), b1n1 and b1n5 must be judged identical
echo "== built-in kernels (expect rc=0)"; python3 -m csa_conform diff goldens/ci.h5 --case "$C" -q; echo "rc=$?"
echo "== illegal address (expect rc=1, b2n3 fault, cudaErrorIllegalAddress, no traceback)"
python3 -m csa_conform diff goldens/ci.h5 --case "$C" --kernels /tmp/k41-segv --json --git-bisect > $OUT/segv.json 2> $OUT/segv.err
echo "rc=$?"; cat $OUT/segv.err
python3 -c "import json; d=json.load(open('$OUT/segv.json')); [print(c['case'], sorted(set(c['verdicts'].values())), [s.get('failure') for s in c['steps']]) for c in d['cases']]"
for name in trap misaligned; do
  echo "== $name (expect rc=1, b2n3 fault named by its CUDA error, the other two identical)"
  python3 -m csa_conform diff goldens/ci.h5 --case "$C" --kernels /tmp/k41-$name --json --git-bisect > $OUT/$name.json 2> $OUT/$name.err
  echo "rc=$?"; cat $OUT/$name.err
  python3 -c "import json; d=json.load(open('$OUT/$name.json')); [print(c['case'], sorted(set(c['verdicts'].values())), [(s.get('failure') or {}).get('message') for s in c['steps']]) for c in d['cases']]"
done
echo "== text (expect FAULT cells and a reproduce with --sanitize memcheck)"
python3 -m csa_conform diff goldens/ci.h5 --case "$C" --kernels /tmp/k41-segv 2>&1 | tail -6
echo "== endless loop, --launch-timeout 5 (expect rc=1, b2n3 hang after ~5 s)"
time python3 -m csa_conform diff goldens/ci.h5 --case "$C" --kernels /tmp/k41-loop --launch-timeout 5 2>&1 | tail -5
echo "== report (expect rc=0 and 1 fault failure in JUnit)"
python3 -m csa_conform report $OUT/segv.json --junit $OUT/junit.xml; echo "rc=$?"; grep -c 'type="fault"' $OUT/junit.xml
echo "== pytest -m cuda test"; python3 -m pytest tests/device/test_kernel_faults.py -q -p no:cacheprovider -k cuda -rs 2>&1 | tail -4
echo "== --sanitize memcheck on the illegal address (expect memcheck errors reported from the worker process)"
python3 -m csa_conform diff goldens/ci.h5 --case "edges.r128-f32-ties-b2n3" --kernels /tmp/k41-segv --sanitize memcheck 2>&1 | tail -8
