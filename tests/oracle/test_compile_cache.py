"""A cached kernel is used only while every source it was compiled from is unchanged.

numba checks a kernel's own file; the package's kernels also inline their
neighbours' code and tables, so compile_cache adds a digest of those
sources to each stamp. These tests fail if an edit elsewhere in the
oracle or numerics would still load the old machine code.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from engine_pairs import needs_numba

pytestmark = needs_numba


@pytest.fixture
def package_copy(tmp_path):
    from csa_conform.oracle.compiled import cache as compile_cache

    copy = tmp_path / "csa_conform"
    for folder in compile_cache.KERNEL_SOURCES:
        shutil.copytree(compile_cache.PACKAGE / folder, copy / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


PROBE_KERNEL = """
from numba import njit
from csa_conform.numerics.probe_table import TABLE
from csa_conform.oracle.compiled.cache import kernel_cache

@njit(cache=kernel_cache())
def first():
    return TABLE[0]
"""


def test_a_cached_kernel_is_compiled_again_after_a_table_it_reads_changes(tmp_path):
    from csa_conform.oracle.compiled import cache as compile_cache

    package = tmp_path / "tree" / "csa_conform"
    shutil.copytree(compile_cache.PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "oracle" / "probe_kernel.py").write_text(PROBE_KERNEL)
    table = package / "numerics" / "probe_table.py"
    environment = dict(os.environ, PYTHONPATH=str(package.parent), NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    command = [sys.executable, "-c", "from csa_conform.oracle.probe_kernel import first; print(first())"]

    def run(value):
        table.write_text(f"import numpy as np\nTABLE = np.array([{value}], dtype=np.int64)\n")
        result = subprocess.run(command, env=environment, cwd=tmp_path, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    assert run(1) == "1" and list((tmp_path / "cache").rglob("*.nbi"))
    assert run(2) == "2"


@pytest.mark.parametrize("edited", ["oracle/compiled/lanes.py", "numerics/e8m0.py", "explain/exact_fma.py"])
def test_an_edit_to_any_kernel_source_changes_the_digest(package_copy, edited):
    from csa_conform.oracle.compiled.cache import sources_digest

    before = sources_digest(package_copy)
    source = package_copy / edited
    source.write_text(source.read_text() + "\n# edited\n")
    sources_digest.cache_clear()
    assert sources_digest(package_copy) != before


def test_a_file_outside_the_kernel_sources_leaves_the_digest(package_copy):
    from csa_conform.oracle.compiled.cache import sources_digest

    before = sources_digest(package_copy)
    outside = package_copy / "compare" / "bitwise.py"
    outside.parent.mkdir(exist_ok=True)
    outside.write_text("changed = True\n")
    sources_digest.cache_clear()
    assert sources_digest(package_copy) == before


def test_the_package_kernels_carry_the_digest_and_other_functions_do_not(tmp_path):
    from numba.core.caching import FunctionCache

    from csa_conform.oracle.compiled import dots as compiled_kernels
    from csa_conform.oracle.compiled.cache import sources_digest

    kernel_stamp = FunctionCache(compiled_kernels.attention_scores.py_func)._impl.locator.get_source_stamp()
    assert isinstance(kernel_stamp, tuple) and kernel_stamp[1] == sources_digest()

    outside = tmp_path / "outside.py"
    outside.write_text("def twice(x):\n    return 2 * x\n")
    namespace = {}
    exec(compile(outside.read_text(), str(outside), "exec"), namespace)
    stamp = FunctionCache(namespace["twice"])._impl.locator.get_source_stamp()
    assert not (isinstance(stamp, tuple) and len(stamp) == 2 and stamp[1] == sources_digest())
