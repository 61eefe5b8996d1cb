"""An inner pytest run (in-process, its imports dropped afterwards) that compiles with numba leaves
this process able to compile again: the plugin's oracle items run the compiled engine there."""

from __future__ import annotations

import textwrap

import pytest

pytest_plugins = ("pytester",)


def test_numba_compiles_after_an_inner_run_that_compiled(pytester):
    numba = pytest.importorskip("numba")
    pytester.makepyfile(test_inner=textwrap.dedent("""
        from numba import njit

        def test_compiles():
            assert njit(lambda value: value * 3)(2) == 6
    """))
    pytester.runpytest("-q", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert numba.njit(lambda value: value * 2.0)(1.5) == 3.0
