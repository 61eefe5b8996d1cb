"""The plugin reads a foreign-but-valid golden file (another byte order, chunking, filter) like the plain one."""

from __future__ import annotations

import pytest

from foreign_layouts import LAYOUTS, rewrite_layout
from plugin_fixtures import GOLDEN_NAME, expected_ids

pytest_plugins = ("pytester",)

ORACLE_IDS = [node for node in expected_ids() if node.endswith("[oracle]")]


@pytest.mark.parametrize("layout", ["big-endian", "lzf-big-endian"])
def test_oracle_items_pass_on_a_foreign_layout(inner, monkeypatch, plugin_goldens, layout):
    rewrite_layout(plugin_goldens, inner.pytester.path / GOLDEN_NAME, LAYOUTS[layout])
    inner.without_device(monkeypatch)
    result = inner.run()
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    passed = {report.nodeid for report in result.reprec.getreports("pytest_runtest_logreport")
              if report.when == "call" and report.passed}
    assert set(ORACLE_IDS) <= passed
