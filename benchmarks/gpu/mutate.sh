#!/bin/bash
# `csa-conform mutate` on one H100 (16 cores + 1 GPU). A stratified sample of 300 mutants of
# the built-in kernels (seed 40, the sample benchmarks/README.md reports), each judged by a chained diff of
# goldens/ci.h5 on the CUDA backend (survivors again with the release gate's staggered --repeat 3), 12 worker
# processes sharing the GPU. Two shards, merged by `report --merged` as a CI job matrix would; then the whole
# sample again on the verdict cache, which must judge nothing. Checks: the two shards' wall times add up to
# <= 15 min (the acceptance) for >= 300 mutants; prints the score, the per-operator table, the survivors (source
# line before and after), faults/hangs with their details, and the time. Run from the repository root;
# jsonschema's wheels installed from .whl/ by the caller. Expected: 8-11 minutes. Each shard is bounded at
# 450 s, half the acceptance: an H100 judged shard 2 in 208 s; shard 1 needs more than 280 s (one of its
# mutants loops forever and is judged hang after --timeout 120).
#
# SHARDS=whole judges the sample as one run instead (one mutate, the jobs shared by both halves; BOUND seconds,
# 900 by default). A device call shorter than the whole run takes one shard at a time, as a job matrix does:
#   SHARDS=1 CACHE=build/k40-cache bash benchmarks/gpu/mutate.sh          (first call; $OUT comes back)
#   SHARDS=2 CACHE=build/k40-cache PRIOR=DIR bash benchmarks/gpu/mutate.sh (second call, the cache carried,
#                                                                          DIR holding the first call's $OUT)
# PRIOR keeps the carried cache (a cut run resumes from it). The merge and the cache re-run happen once both
# shards' documents are present.
# Outputs: $OUT/mutate-shard-K.json, wall-K.txt, progress-K.txt; once merged, mutate.json, mutate.html,
# mutate-junit.xml.
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
SAMPLE="--sample 300 --seed 40 --repeat 3"
JOBS=12
SHARDS=${SHARDS:-"1 2"}
CACHE=${CACHE:-/tmp/k40-mutate-cache}
[ -n "$PRIOR" ] || rm -rf "$CACHE"
nvidia-smi --query-gpu=name,compute_mode,memory.used,memory.total --format=csv,noheader; echo "cores: $(nproc)"
for K in $SHARDS; do
  if [ "$K" = whole ]; then PART=""; LIMIT=${BOUND:-900}; DOC=$OUT/mutate.json; else PART="--shard $K/2"; LIMIT=450; DOC=$OUT/mutate-shard-$K.json; fi
  echo "== ${PART:-the whole sample,} mutate $SAMPLE, CUDA, --jobs $JOBS, bounded at $LIMIT s"
  START=$(date +%s.%N)
  timeout $LIMIT python3 -m csa_conform mutate goldens/ci.h5 $SAMPLE $PART --jobs $JOBS --timeout 120 \
      --cache-dir "$CACHE" --json > $DOC 2> $OUT/progress-$K.txt
  RC=$?; END=$(date +%s.%N)
  python3 -c "print(f'{$END - $START:.1f}')" > $OUT/wall-$K.txt
  echo "rc=$RC wall $(cat $OUT/wall-$K.txt) s (124: cut at $LIMIT s; the verdicts so far are in the cache)"
  grep -c ": killed\|: survived\|: fault\|: hang\|: did-not-build" $OUT/progress-$K.txt; tail -2 $OUT/progress-$K.txt
done
if [ "$SHARDS" = whole ]; then
  [ -s $OUT/mutate.json ] || exit 0
  python3 -m csa_conform report $OUT/mutate.json --html $OUT/mutate.html --junit $OUT/mutate-junit.xml; echo "report rc=$?"
else
  DOCS=(); WALLS=()
  for K in 1 2; do
    for D in "$OUT" "$PRIOR"; do
      if [ -n "$D" ] && [ -s "$D/mutate-shard-$K.json" ]; then DOCS+=("$D/mutate-shard-$K.json"); WALLS+=("$(cat $D/wall-$K.txt)"); break; fi
    done
  done
  if [ ${#DOCS[@]} -lt 2 ]; then echo "== ${#DOCS[@]} of 2 shard documents so far: the merge waits for the other shard"; exit 0; fi
  echo "== both shards: $(python3 -c "print(f'{${WALLS[0]} + ${WALLS[1]}:.1f}')") s wall for the 300 mutants (${WALLS[0]} + ${WALLS[1]}; acceptance: <= 900 s)"
  python3 -m csa_conform report "${DOCS[@]}" --merged $OUT/mutate.json \
      --html $OUT/mutate.html --junit $OUT/mutate-junit.xml; echo "report rc=$?"
fi
echo "== the whole sample again on the cache (expect: nothing judged again), the text report"
time timeout 120 python3 -m csa_conform mutate goldens/ci.h5 $SAMPLE --jobs $JOBS --timeout 120 --cache-dir "$CACHE"
echo "rc=$?"
python3 - <<PY
import json
d = json.load(open("$OUT/mutate.json"))["mutate"]
print(f"merged: score {d['summary']['score']}, {d['summary']}")
print(f"baseline {d['baseline_s']} s, workers started {d['workers_started']}, timeout {d['timeout_s']} s")
for m in d["mutants"]:
    if m["verdict"] in ("fault", "hang", "did-not-build"):
        print(" ", m["id"], m["verdict"], m["detail"][:160])
times = sorted(m["time_s"] for m in d["mutants"])
print(f"per mutant: median {times[len(times) // 2]:.1f} s, max {times[-1]:.1f} s")
PY
