"""In a checkout (or an editable install) the package data is the repository's own folders."""

from __future__ import annotations

from pathlib import Path

from csa_conform._base.resources import builtin_kernels, ci_goldens
from csa_conform.cli.diff import DEFAULT_FILE
from csa_conform.device.kernels import KernelDirectory

ROOT = Path(__file__).resolve().parents[2]


def test_checkout_reads_the_top_level_kernels_and_goldens():
    assert builtin_kernels() == ROOT / "kernels"
    assert ci_goldens() == ROOT / "goldens" / "ci.h5"


def test_diff_and_the_kernel_directory_default_to_them():
    assert Path(DEFAULT_FILE) == ci_goldens()
    assert KernelDirectory().path == builtin_kernels()
