#!/usr/bin/env bash
# The ci suite's gaps closed (negative index dots, guard bands, barriers), on CUDA. Run from the repository root.
# Checks, with the CUDA backend (BACKEND=host runs the same on the host emulation, a check of this script):
#   1. the built-in kernels pass goldens/ci.h5 with guard bands on (no out-of-bounds false positive), exit 0;
#   2. an index scorer without its ReLU fails (the three -signed cases diverge at 4:score), exit 1;
#   3. the guard-band mutants (a score written past the end / at index -1 of the score scratch) fail a plain
#      diff with an out-of-bounds finding (OOB), exit 1;
#   4. the out-of-bounds mutants (FP8 quantizer i <= 64, local pooled[511], pooling i <= dim, one tile
#      slot too many in attention: j <= count, and min(TILE + 1) in the probability loop): plain diff, then
#      --sanitize memcheck where compute-sanitizer exists (for those plain diff passes);
#   5. the three index-select barrier deletions the host backend's plain diff passes (the radix digit barrier,
#      the gather counter barrier, the redundant one after scoring): plain diff, --repeat 3, and
#      --sanitize racecheck / synccheck where compute-sanitizer exists;
#   6. the cuda-marked mutant tests of the changed table entries (pytest).
# Each line printed is "RESULT <what> rc=<exit code> <last line of the run>"; logs under $OUT.
# Budget: about 4 minutes on an H100 (memcheck/racecheck runs are limited to one or two cases each): the
# sanitizer runs stop after BUDGET seconds (default 240); SANITIZERS_ONLY=1 runs only them.
set -uo pipefail
OUT=${OUT:-/tmp/k40-suite-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
BACKEND=${BACKEND:-cuda}
PY=${PY:-python3}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
START=$(date +%s)

$PY - "$WORK" <<'EOF'
import shutil, sys
from pathlib import Path
sys.path.insert(0, "tests/kernels_mutants")
from mutants import MUTANTS

work, kernels = Path(sys.argv[1]), Path("kernels")
for mutant in MUTANTS:
    if mutant.name in ("index_score_without_relu", "index_scores_written_past_the_scratch",
                       "index_scores_written_before_the_scratch"):
        mutant.apply(kernels, work / mutant.name)

PRELUDE, SELECT = "block_quant.cuh", "csa_ratio4_index_select.cu"
PATCHES = {
    "oob_fp8_quantizer_le_64": (PRELUDE, "    for (int i = 0; i < 64; ++i)\n        packed[i] = csa_encode_e4m3fn",
                                "    for (int i = 0; i <= 64; ++i)\n        packed[i] = csa_encode_e4m3fn"),
    "oob_local_pooled_511": (PRELUDE, "        float pooled[512];", "        float pooled[511];"),
    "oob_pooling_le_dim": (PRELUDE, "        float pooled[512];\n        for (int i = 0; i < dim; ++i) {",
                           "        float pooled[512];\n        for (int i = 0; i <= dim; ++i) {"),
    "oob_tile_j_le_count": (PRELUDE, "            for (int j = thread; j < count; j += threads) {\n"
                            "                const float logit = slot_scores[first + j];\n                tile_weight[j]",
                            "            for (int j = thread; j <= count; j += threads) {\n"
                            "                const float logit = slot_scores[first + j];\n                tile_weight[j]"),
    "oob_tile_plus_one_probabilities": (PRELUDE, "                const int count = min(CSA_ATTENTION_TILE, slots - first);\n"
                                        "                __syncthreads();",
                                        "                const int count = min(CSA_ATTENTION_TILE + 1, slots - first);\n"
                                        "                __syncthreads();"),
    "barrier_digit_published": (SELECT, "        __syncthreads();  // thread 0 has published the digit and is done with the histogram\n", ""),
    "barrier_gather_counter": (SELECT, "    __syncthreads();  // the gather counter is clear\n", ""),
    "barrier_scores_written": (SELECT, "    __syncthreads();  // every causal score is written\n", ""),
}
for name, (file, old, new) in PATCHES.items():
    target = work / name
    shutil.copytree(kernels, target)
    (target / "csa-kernels.toml").write_text('build = "strict"\n')
    text = (target / file).read_text()
    assert text.count(old) == 1, name
    (target / file).write_text(text.replace(old, new))
print(f"built {len(PATCHES) + 3} mutant directories")
EOF

run() {  # run NAME ARGS...: one diff, its exit code and last line
    local name=$1; shift
    local t0=$(date +%s)
    timeout 150 $PY -m csa_conform diff goldens/ci.h5 --backend "$BACKEND" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    echo "RESULT $name rc=$rc ($(( $(date +%s) - t0 )) s) $(grep -v '^\s*$' "$OUT/$name.log" | tail -1 | cut -c1-160)"
    grep -m2 "out-of-bounds write\|diverges at\|non-deterministic:\|memcheck \|racecheck \|synccheck " "$OUT/$name.log" \
        | cut -c1-240 | sed 's/^/    /'
}
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
[ "$BACKEND" = cuda ] || SANITIZER=""
echo "compute-sanitizer: ${SANITIZER:-none}"
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sed 's/^/device: /'

if [ "${SANITIZERS_ONLY:-0}" != 1 ]; then
# 1. no false positive: the whole ci suite, guard bands on
run builtin-ci
# 2. the ReLU
run relu-less --kernels "$WORK/index_score_without_relu" --case 'random.r4-*-signed'
# 3. guard bands on CUDA
run guard-past-end --kernels "$WORK/index_scores_written_past_the_scratch" --case 'boundaries.r4-*'
run guard-before-start --kernels "$WORK/index_scores_written_before_the_scratch" --case 'boundaries.r4-*'
# 4. the out-of-bounds classes: compressors on block ends of both ratios, attention with > 256 candidates
COMPRESS='boundaries.r*-prefill-*'
TILE='edges.r128-fp8-rope-*'
run oob-fp8-quantizer --kernels "$WORK/oob_fp8_quantizer_le_64" --case "$COMPRESS"
run oob-local-pooled-511 --kernels "$WORK/oob_local_pooled_511" --case "$COMPRESS"
run oob-pooling-le-dim --kernels "$WORK/oob_pooling_le_dim" --case "$COMPRESS"
run oob-tile-j-le-count --kernels "$WORK/oob_tile_j_le_count" --case "$TILE"
run oob-tile-plus-one --kernels "$WORK/oob_tile_plus_one_probabilities" --case "$TILE"
# 5. barriers: plain and --repeat 3 over the ratio-4 boundary cases
for barrier in digit_published gather_counter scores_written; do
    run "barrier-$barrier" --kernels "$WORK/barrier_$barrier" --case 'boundaries.r4-*'
    run "barrier-$barrier-repeat3" --kernels "$WORK/barrier_$barrier" --case 'boundaries.r4-*' --repeat 3
done
# 6. the changed mutant table entries, as the cuda-marked tests judge them
if [ "$BACKEND" = cuda ]; then
    timeout 150 $PY -m pytest tests/kernels_mutants/test_mutants.py -m cuda -q -p no:cacheprovider -n 0 \
        -k "relu or written_past or written_before" > "$OUT/pytest-mutants.log" 2>&1
    echo "RESULT pytest-cuda-mutants rc=$? $(tail -1 "$OUT/pytest-mutants.log")"
fi
fi
sanitize() {  # like run, unless the script's budget is spent
    if [ $(( $(date +%s) - START )) -gt ${BUDGET:-240} ]; then echo "RESULT $1 SKIPPED (the script's budget)"; return; fi
    run "$@"
}
if [ -n "$SANITIZER" ]; then
    export PATH=$(dirname "$SANITIZER"):$PATH
    sanitize memcheck-builtin --sanitize memcheck --case 'boundaries.r4-prefill-4'
    sanitize memcheck-guard-past-end --kernels "$WORK/index_scores_written_past_the_scratch" --sanitize memcheck \
        --case 'boundaries.r4-prefill-4'
    for mutant in local_pooled_511 pooling_le_dim fp8_quantizer_le_64; do
        sanitize "memcheck-oob-$mutant" --kernels "$WORK/oob_$mutant" --sanitize memcheck --case 'boundaries.r4-prefill-4'
    done
    sanitize memcheck-oob-tile-j-le-count --kernels "$WORK/oob_tile_j_le_count" --sanitize memcheck \
        --case 'edges.r128-fp8-rope-65536'
    sanitize memcheck-guard-before-start --kernels "$WORK/index_scores_written_before_the_scratch" --sanitize memcheck \
        --case 'boundaries.r4-prefill-4'
    for tool in racecheck synccheck; do
        for barrier in digit_published gather_counter; do
            sanitize "$tool-barrier-$barrier" --kernels "$WORK/barrier_$barrier" --sanitize $tool \
                --case 'boundaries.r4-chunks-*'
        done
    done
fi
echo "total $(( $(date +%s) - START )) s"
echo "expected: builtin-ci 0; relu-less 1; guard-* 1 (OOB); barrier-digit_published-repeat3 may be 0 on a GPU (a race";
echo "that may not happen); memcheck-builtin 0; memcheck-guard-past-end 1; the rest is what this run measures."
