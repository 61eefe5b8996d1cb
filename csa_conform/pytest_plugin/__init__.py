"""pytest plugin (entry point ``pytest11``): a golden file as test items, so a kernel repository gates
on conformance inside its own test suite (``pytest --csa-goldens FILE``; specs/pytest-plugin.md).

The plugin is loaded into every pytest run of an environment that has csa-conform installed, so this
module only declares options and the backend hook: without ``--csa-goldens`` nothing else is
imported, collected or run.
"""

from __future__ import annotations

import pytest

from csa_conform.pytest_plugin.choices import BACKENDS, BUILDS, DEFAULT_BACKEND, DEFAULT_BUILD, DEFAULT_MODE, MODES


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("csa-conform", "CSA conformance (csa-conform golden files)")
    group.addoption(
        "--csa-goldens", metavar="FILE", default=None,
        help="Golden file to check: one item per case, stage and side (golden file vs oracle, device vs oracle).",
    )
    group.addoption(
        "--csa-kernels", metavar="DIR", default=None,
        help="Kernel directory the device items run (block_quant.cuh + one .cu module per kernel launch); "
        "default: the built-in kernels.",
    )
    group.addoption(
        "--csa-build", choices=BUILDS, default=None,
        help=f"Kernel build profile of the device items (default {DEFAULT_BUILD}).",
    )
    group.addoption(
        "--csa-mode", choices=MODES, default=None,
        help=f"chained: device outputs feed device stages; isolated: every stage reads the oracle's "
        f"payloads (default {DEFAULT_MODE}).",
    )
    group.addoption(
        "--csa-backend", choices=BACKENDS, default=None,
        help=f"Where the device items launch: cuda (device 0), or host (every module built with g++ and run on "
        f"the CPU, no GPU needed; specs/host-backend.md) (default {DEFAULT_BACKEND}).",
    )
    group.addoption("--csa-case", metavar="GLOB", default=None, help="Only cases whose id matches GLOB.")
    group.addoption(
        "--csa-bench-baseline", metavar="FILE", default=None,
        help="Also a bench item per case, failing when a row is SLOW against FILE (an earlier "
        "`csa-conform bench --json --samples S` document) or refused; sampled in FILE's mode and time cap.",
    )


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from csa_conform.pytest_plugin import hooks

    pluginmanager.add_hookspecs(hooks)


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("csa_goldens") is None:
        stray = [name for name in ("kernels", "build", "mode", "backend", "case", "bench_baseline")
                 if config.getoption(f"csa_{name}")]
        if stray:
            raise pytest.UsageError(f"--csa-{stray[0].replace('_', '-')} needs --csa-goldens FILE")
        return
    from csa_conform.pytest_plugin.session import GoldenSession

    config.pluginmanager.register(GoldenSession(config), GoldenSession.NAME)
