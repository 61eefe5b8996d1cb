"""The committed ci suite catches every planted bug a plain diff should catch in at least three cases
(host emulation), so a bug that shows at one shape only is not left to a single case. Each mutant
stops at its third catching case, the cases its ``cases`` pattern names tried first."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest
from diagnosis_mutants import DIAGNOSED
from mutants import DIFF_MUTANTS
from thin_mutants import THIN_MUTANTS

from csa_conform.check.conformance import check_case
from csa_conform.device import DeviceRunner, KernelDirectory
from csa_conform.spec import STAGE_NAMES

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "kernels"
MINIMUM = 3
COVERED = {mutant.name: mutant for mutant in (*DIFF_MUTANTS, *THIN_MUTANTS, *(d.mutant for d in DIAGNOSED))}


@pytest.mark.usefixtures("emulated_cuda")
@pytest.mark.parametrize("name", sorted(COVERED))
def test_the_ci_suite_catches_each_planted_bug_in_several_cases(name, tmp_path, ci_golden):
    mutant = COVERED[name]
    runner = DeviceRunner(KernelDirectory(mutant.apply(KERNELS, tmp_path / "kernels")))
    caught = []
    cases = sorted(ci_golden.case_ids(), key=lambda case: not fnmatch.fnmatchcase(case, mutant.cases))
    for case in cases:
        if not check_case(ci_golden, case, runner, STAGE_NAMES).passed:
            caught.append(case)
            if len(caught) == MINIMUM:
                break
    assert len(caught) >= MINIMUM, f"{name} is caught by {len(caught)} ci cases only: {caught}"
