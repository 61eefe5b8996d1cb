"""`csa-conform fuzz` on the host emulation: it finds a bug the ci suite catches in few cases, shrinks
it, writes a golden file that reproduces it (and passes with the built-in kernels), replays from its
example database, and exits 0 when the budget runs out without a divergence."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from edge_mutants import EDGE_MUTANTS
from thin_mutants import THIN_MUTANTS

from csa_conform.check.verify import verify_case
from csa_conform.cli import main
from csa_conform.exitcodes import ExitCode
from csa_conform.golden import GoldenFile

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "kernels"
SINK = next(mutant for mutant in THIN_MUTANTS if mutant.name == "sink_inside_the_max")
WINDOW = next(mutant for mutant in EDGE_MUTANTS if mutant.name == "r4_window_one_early_past_128")

pytestmark = pytest.mark.usefixtures("emulated_cuda")


def _run(*args):
    return CliRunner().invoke(main, [str(arg) for arg in args])


def test_a_thinly_covered_bug_is_found_shrunk_written_and_replayed(tmp_path):
    kernels = SINK.apply(KERNELS, tmp_path / "kernels")
    found, database = tmp_path / "found.h5", tmp_path / "examples"
    result = _run("fuzz", "--kernels", kernels, "--budget-s", 60, "--database", database, "-o", found)
    assert result.exit_code == ExitCode.DIVERGED, result.output
    assert "fuzz: divergence at sparse_sink_softmax_attention/" in result.stdout
    assert re.search(r"^  case: ratio \d+; .*; sink shift [-+]\d+$", result.stdout, re.MULTILINE)
    assert f"reproduce: csa-conform diff {found} --stage all --mode chained --case fuzz.case --kernels {kernels}" \
        in result.stdout
    assert f"replay the search: csa-conform fuzz --kernels {kernels} --budget-s 60 --database {database}" \
        in result.stdout
    with GoldenFile(found) as golden:
        assert golden.case_ids() == ["fuzz.case"] and verify_case(golden, "fuzz.case").passed
    assert _run("diff", found, "--kernels", kernels, "-q").exit_code == ExitCode.DIVERGED
    assert _run("diff", found, "-q").exit_code == ExitCode.OK
    again = _run("fuzz", "--kernels", kernels, "--budget-s", 60, "--database", database, "-o", found, "--force")
    assert again.exit_code == ExitCode.DIVERGED
    replayed = int(re.search(r"after (\d+) valid cases", again.stdout).group(1))
    assert replayed <= 3, again.stdout  # the database's failures come first


def test_a_seed_draws_the_same_cases(tmp_path):
    kernels = SINK.apply(KERNELS, tmp_path / "kernels")
    runs = [_run("fuzz", "--kernels", kernels, "--budget-s", 60, "--seed", 3, "-o", tmp_path / f"{n}.h5", "-q")
            for n in range(2)]
    assert [run.exit_code for run in runs] == [ExitCode.DIVERGED] * 2
    assert runs[0].stdout.splitlines()[1] == runs[1].stdout.splitlines()[1]  # the same smallest case
    first, second = (re.sub(r"in \d+ s", "", run.stdout.splitlines()[0]) for run in runs)
    assert first == second


@pytest.mark.slow
def test_a_ratio_4_window_that_starts_one_position_early_past_128_is_found(tmp_path):
    """Only a ratio-4 step past position 127 whose current_kv reaches before its window shows it: the
    draws past the window fill find it (the 7th valid draw of seed 1), well inside the budget."""
    kernels = WINDOW.apply(KERNELS, tmp_path / "kernels")
    found = tmp_path / "found.h5"
    result = _run("fuzz", "--kernels", kernels, "--budget-s", 120, "--seed", 1, "-o", found)
    assert result.exit_code == ExitCode.DIVERGED, result.output
    assert "fuzz: divergence at candidate_assembly/candidates" in result.stdout
    first = int(re.search(r"the first diverging one in (\d+) s", result.stdout).group(1))
    assert first <= 120 and re.search(r"^  case: ratio 4; .*; steps from (1[2-9]\d|[2-9]\d\d)", result.stdout, re.M)
    assert _run("diff", found, "-q").exit_code == ExitCode.OK


def test_no_divergence_within_the_budget_exits_0_and_writes_nothing(tmp_path):
    found = tmp_path / "found.h5"
    result = _run("fuzz", "--budget-s", 3, "--database", tmp_path / "examples", "-o", found, "-q")
    assert result.exit_code == ExitCode.OK, result.output
    assert re.fullmatch(r"fuzz: no divergence in \d+ valid cases \(\d+ drawn\) in \d+ s; database \S+\n",
                        result.stdout)
    assert not found.exists()
