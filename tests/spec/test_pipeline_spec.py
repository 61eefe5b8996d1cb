"""The pipeline spec is data: it imports no code that runs stages, and every consumer covers every entry."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from csa_conform.device.launches import READ_BACKS
from csa_conform.oracle.engine import Engine
from csa_conform.oracle.stage_functions import STAGE_FUNCTIONS
from csa_conform.spec import PIPELINE, STAGE_NAMES, ReadBack, Role

SPEC = Path(__file__).resolve().parents[2] / "csa_conform" / "spec"


def imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_the_spec_imports_only_itself_and_the_numerics():
    for path in SPEC.glob("*.py"):
        ours = {name for name in imported_modules(path) if name.startswith("csa_conform")}
        assert all(name.startswith(("csa_conform.spec", "csa_conform.numerics")) for name in ours), (path.name, ours)


def test_the_oracle_registers_one_function_per_stage_in_order():
    assert tuple(STAGE_FUNCTIONS) == STAGE_NAMES


def test_the_device_reads_back_every_launch_shape():
    assert set(READ_BACKS) == set(ReadBack)


def test_engine_slots_are_the_engine_functions():
    slots = {stage.engine_slot for stage in PIPELINE if stage.engine_slot}
    assert slots == {field.name for field in dataclasses.fields(Engine)} - {"name", "numerics"}


def test_one_writeback_stage_and_it_is_last():
    assert [stage.name for stage in PIPELINE if stage.role is Role.WRITEBACK] == [PIPELINE[-1].name]
    assert [stage.number for stage in PIPELINE] == list(range(1, len(PIPELINE) + 1))
