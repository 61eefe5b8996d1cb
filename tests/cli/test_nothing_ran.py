"""A case whose every step the reference rejects runs nothing: bisect says so, and no banner calls it a
control run (which would claim stages ran on the host oracle)."""

from pathlib import Path

from click.testing import CliRunner

from csa_conform.cli.bisect import bisect
from csa_conform.exitcodes import ExitCode

CI_GOLDENS = Path(__file__).resolve().parents[2] / "goldens" / "ci.h5"


def test_bisect_of_a_rejected_case_says_nothing_ran_without_a_control_banner():
    result = CliRunner().invoke(bisect, [str(CI_GOLDENS), "--case", "errors.attr-causal-0"])
    assert result.exit_code == ExitCode.OK, result.output
    assert "nothing ran: the reference rejects every step" in result.stdout
    assert "no divergence" not in result.stdout and "CONTROL RUN" not in result.stderr
