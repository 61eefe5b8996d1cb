"""diff's table has a row per case that ran: the cases whose every step the oracle rejects as stored are
one line under it, unless the selection holds nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from golden_edits import rewrite

from csa_conform.cli import main
from csa_conform.exitcodes import ExitCode
from csa_conform.golden import GoldenFile, write_goldens

ROOT = Path(__file__).resolve().parents[2]
ACCEPTED = ("boundaries.r4-prefill-3", "random.r128-bias-1111")
REJECTED = tuple(f"errors.attr-{name}" for name in ("causal-0", "head-dim-missing", "num-heads-zero",
                                                      "num-heads-float", "index-layout-2"))
Y = "cases/random.r128-bias-1111/steps/0000/stages/sparse_sink_softmax_attention/Y"


def invoke(*args):
    return CliRunner().invoke(main, [str(arg) for arg in args])


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Path:
    """Two accepted cases (the ratio-128 one's Y altered and resealed) and five rejected ones."""
    path = tmp_path_factory.mktemp("rejected") / "mixed.h5"
    with GoldenFile(ROOT / "goldens" / "ci.h5") as golden:
        write_goldens(path, [golden.read_case(case) for case in ACCEPTED + REJECTED],
                      provenance={"suite": "ci", "suite_seed": 0, "selection": "mixed"})

    def bump(array):
        array.reshape(-1)[::5] += 0.001

    rewrite(path, Y, bump)
    return path


def rows(text: str) -> list[str]:
    return [line.split()[0] for line in text.splitlines() if line.startswith(("boundaries.", "random.", "errors."))
            and "  " in line and not line.startswith(tuple(f"{case}:" for case in ACCEPTED))]


@pytest.mark.parametrize("mode", ["chained", "isolated"])
def test_rejected_cases_are_one_line_under_the_table(mixed, mode):
    result = invoke("diff", mixed, "--force-host", "all", "--mode", mode)
    assert result.exit_code == ExitCode.DIVERGED, result.output
    lines = result.stdout.splitlines()
    assert rows(result.stdout) == sorted(ACCEPTED)
    under = [line for line in lines if "oracle-rejected cases not in the table" in line]
    assert len(under) == 1 and under[0].startswith("5 oracle-rejected cases not in the table")
    assert under[0].endswith(", and 1 more") and sum(case in under[0] for case in REJECTED) == 4
    assert lines.index(under[0]) == lines.index(next(line for line in lines if line.startswith("random."))) + 1
    assert "7 cases, 2 steps compared, 5 oracle-rejected steps skipped: 6 conformant, 1 diverged" in result.stdout
    # isolated, writeback reads the altered attention/Y and so diverges on its own (other values): not folded
    assert ("diverges at 8:writeback step 0" in result.stdout) == (mode == "isolated")


def test_a_selection_of_rejected_cases_only_is_the_table(mixed):
    result = invoke("diff", mixed, "--force-host", "all", "--case", "errors.*")
    assert result.exit_code == ExitCode.OK, result.output
    assert rows(result.stdout) == sorted(REJECTED)
    assert "not in the table" not in result.stdout
