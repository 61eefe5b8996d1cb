"""Every error carries its exit code; exit_code_of is the one mapping, --git-bisect included."""

from __future__ import annotations

import pytest

from csa_conform.errors import (
    ContractError,
    CorruptDataset,
    DeviceUnavailable,
    FixtureError,
    GoldenFormatError,
    HostStageRejected,
    UsageError,
    exit_code_of,
)
from csa_conform.exitcodes import ExitCode


@pytest.mark.parametrize(
    "error, plain, bisecting",
    [
        (UsageError("x"), ExitCode.USAGE, ExitCode.USAGE),
        (ContractError("x"), ExitCode.USAGE, ExitCode.USAGE),
        (HostStageRejected("selection", "x"), ExitCode.USAGE, ExitCode.USAGE),
        (FixtureError("x"), ExitCode.DIVERGED, ExitCode.DIVERGED),
        (GoldenFormatError("goldens/ci.h5: no such file"), ExitCode.USAGE, ExitCode.BISECT_SKIP),
        (CorruptDataset("g.h5", "/cases/c/steps/0000/outputs/Y", "sha256 mismatch"), ExitCode.DIVERGED,
         ExitCode.BISECT_SKIP),
        (DeviceUnavailable("no CUDA"), ExitCode.ENVIRONMENT, ExitCode.BISECT_SKIP),
        (FileNotFoundError("results.json"), ExitCode.USAGE, ExitCode.USAGE),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else str(int(value)),
)
def test_exit_code_of(error, plain, bisecting):
    assert exit_code_of(error) is plain
    assert exit_code_of(error, git_bisect=True) is bisecting
