#!/usr/bin/env bash
# The CPU reference kernel's own cases (tests/reference) as a golden file, then whole-corpus `diff --explain` of a
# kernel directory on it (KERNELS, default the built-in kernels; BACKEND, default cuda): the built-in kernels are
# conformant (exit 0); another directory's verdicts are printed with their headlines. The corpus's error cases are
# left out (no outputs to compare); every output the oracle writes is checked against the corpus's first.
# Writes $OUT/corpus.h5 and $OUT/corpus-explain.json.
set -u
# run from the repository root
OUT="${OUT:-/tmp/corpus-out}"; mkdir -p "$OUT"
export PYTHONPATH="$PWD"
timeout 120 python3 - "$OUT/corpus.h5" <<'PY' || exit 4
import json, sys
import numpy as np
sys.path.insert(0, "tests")
from reference_corpus import case_files, expected_error, reference_file, step_inputs, step_prefixes
from csa_conform.golden import GoldenCase, write_goldens
from csa_conform.golden.carries import omitted_carries
from csa_conform.golden.layout import GoldenStep
from csa_conform.oracle import run_step

cases = []
for name in case_files():
    archive = reference_file(name)
    attrs, outputs = json.loads(str(archive["attrs_json"])), json.loads(str(archive["output_names_json"]))
    prefixes = step_prefixes(archive)
    if any(expected_error(archive, prefix) is not None for prefix in prefixes):
        continue
    steps = []
    for prefix in prefixes:
        inputs = step_inputs(archive, prefix)
        result = run_step(attrs, {**inputs, **omitted_carries(attrs, inputs)}, outputs)
        for output in outputs:
            assert np.asarray(result.outputs[output]).tobytes() == archive[prefix + "out/" + output].tobytes(), name
        steps.append(GoldenStep(inputs=inputs, outputs=dict(result.outputs), stages=dict(result.stages)))
    cases.append(GoldenCase("corpus." + name.removesuffix(".npz").replace("_", "-"), attrs, tuple(outputs), steps,
                            family="corpus"))
write_goldens(sys.argv[1], cases, force=True)
print(f"corpus golden: {len(cases)} cases, {sum(len(case.steps) for case in cases)} steps")
PY
started=$(date +%s)
timeout 400 python3 -m csa_conform diff "$OUT/corpus.h5" --kernels "${KERNELS:-kernels}" --backend "${BACKEND:-cuda}" \
    --explain --json -q > "$OUT/corpus-explain.json"
code=$?
echo "diff --explain of ${KERNELS:-kernels} on the corpus: exit $code, $(( $(date +%s) - started )) s"
python3 - "$OUT/corpus-explain.json" <<'PY'
import collections, json, sys
document = json.load(open(sys.argv[1]))
print(document["summary"])
explanations = (document.get("explain") or {}).get("explanations", [])
print(dict(collections.Counter(explanation["verdict"] for explanation in explanations)))
for explanation in explanations:
    if explanation["verdict"] != "inherited":
        print(f"  {explanation['verdict']}: {explanation['headline'][:400]}")
PY
