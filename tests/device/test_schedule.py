"""The staggered builds of ``diff --repeat`` on CUDA, through nvcc (no GPU needed): the header keeps every
barrier and every source line where it was, and adds the wait after each barrier."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from csa_conform.device.kernels import NVCC_OPTIONS, KernelDirectory
from csa_conform.device.schedule import staggered, turn

NVCC = shutil.which("nvcc") or ("/usr/local/bin/nvcc" if Path("/usr/local/bin/nvcc").exists() else None)
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")


def test_the_later_runs_alternate_the_two_orders():
    assert [turn(run) for run in range(6)] == [0, 1, 2, 1, 2, 1]


def _ptx(source: str, architecture: str, tmp_path: Path, name: str) -> str:
    unit = tmp_path / f"{name}.cu"
    unit.write_text(source)
    result = subprocess.run([NVCC, f"-arch={architecture}", *NVCC_OPTIONS, "-lineinfo", "--ptx", str(unit), "-o",
                             str(unit.with_suffix(".ptx"))], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return unit.with_suffix(".ptx").read_text()


def _barrier_lines(ptx: str) -> list[int]:
    """The source line of every barrier instruction, from the .loc before it."""
    lines, line = [], None
    for text in ptx.splitlines():
        located = re.match(r"\s*\.loc\s+\d+\s+(\d+)", text)
        if located:
            line = int(located.group(1))
        elif re.match(r"\s*(bar|barrier)\.sync", text):
            lines.append(line)
    return lines


@needs_nvcc
@pytest.mark.parametrize("order", [1, 2])
def test_a_staggered_module_has_the_same_barriers_on_the_same_lines_and_a_wait_after_each(order, tmp_path):
    module = KernelDirectory().module("csa_ratio4_index_select")
    plain = _ptx(module.source, "sm_90", tmp_path, "plain")
    ptx = _ptx(staggered(module, order).source, "sm_90", tmp_path, f"staggered{order}")
    assert _barrier_lines(plain) and _barrier_lines(ptx) == _barrier_lines(plain)
    assert len(re.findall(r"\bnanosleep\.u32\b", ptx)) >= len(_barrier_lines(plain)) and "nanosleep" not in plain
