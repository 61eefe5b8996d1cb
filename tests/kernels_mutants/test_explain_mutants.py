"""The third bug set (explain_mutants.py): a porting bug gets no false claim and no failed explanation at
its first divergent stage and, with a specific expectation, is named there; a bit-identical refactor is
conformant. Emulated on the host; the sweep (marked slow) runs the kinds no other mutant test covers: an
aliased row, a layout read and written, a pool named on positive evidence, the index query's scale exponent, a
Hadamard left out, a read without its head offset, a softmax by reciprocal, a fast-math exp of the P·V weights
(told from exp2f everywhere by the case's other step), P·V normalized once at the end or summed in binary64,
logit dots summed in binary64, a refactor. The whole set's table is tests/kernels_mutants/explain_table.py
(and build/gpu/explain.sh on a GPU)."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest
from explain_mutants import EXPLAIN_BUGS
from explain_table import classify

from csa_conform.check.conformance import check_case
from csa_conform.device import DeviceRunner, KernelDirectory
from csa_conform.explain import explain_cases
from csa_conform.explain.patterns import stage_findings
from csa_conform.spec import STAGE_NAMES

SWEPT = ("index_query_reads_batch_zero", "index_query_read_head_major", "attention_output_written_head_major",
         "overlap_pool_reads_the_wrong_half", "dense_window_one_longer_on_a_first_step", "refactor_causal_count_shift",
         "index_query_scale_from_frexpf", "index_query_skips_the_hadamard", "sink_of_head_zero_for_every_head",
         "softmax_reciprocal_multiply", "fast_math_exp", "pv_deferred_normalization", "pv_binary64_accumulator",
         "logit_binary64_accumulator")
KERNELS = Path(__file__).resolve().parents[2] / "kernels"


@pytest.mark.parametrize("bug", EXPLAIN_BUGS, ids=lambda bug: bug.name)
def test_each_patch_applies_exactly_once(bug, tmp_path):
    patched = bug.apply(KERNELS, tmp_path / "kernels")
    assert (patched / bug.file).read_text() != (KERNELS / bug.file).read_text()


@pytest.mark.slow
@pytest.mark.usefixtures("emulated_cuda")
@pytest.mark.parametrize("bug", [bug for bug in EXPLAIN_BUGS if bug.name in SWEPT], ids=lambda bug: bug.name)
def test_a_bug_of_the_third_set_gets_no_false_claim(bug, tmp_path, ci_golden):
    kernels = KernelDirectory(bug.apply(KERNELS, tmp_path / "kernels"), build="strict")
    cases = [case for case in ci_golden.case_ids() if fnmatch.fnmatchcase(case, bug.cases)]
    assert cases
    reports = [check_case(ci_golden, case, DeviceRunner(kernels), STAGE_NAMES, diagnose=stage_findings)
               for case in cases]
    explanations = explain_cases(ci_golden, [case for case, report in zip(cases, reports) if not report.passed],
                                 kernels)
    document = {"passed": all(report.passed for report in reports),
                "explain": {"explanations": [explanation.to_dict() for explanation in explanations]}}
    outcome, headline = classify(bug, document)
    if bug.stage is None:
        assert outcome == "clean", headline
        return
    assert outcome not in ("false", "failed"), headline
    if bug.named:
        assert outcome == "named", headline
