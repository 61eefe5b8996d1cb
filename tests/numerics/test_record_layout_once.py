"""The record layout (583-byte FP8 hybrid, 68-byte FP4 index records, their 65- and 17-byte blocks)
is stated once, in csa_conform/numerics/records.py: nowhere else does the package spell it."""

import ast
from pathlib import Path

import csa_conform
from csa_conform.numerics.records import FP4_BLOCK_BYTES, FP4_RECORD_BYTES, FP8_BLOCK_BYTES, FP8_RECORD_BYTES

PACKAGE = Path(csa_conform.__file__).parent
WIDTHS = {FP8_RECORD_BYTES, FP4_RECORD_BYTES, FP8_BLOCK_BYTES}


def test_the_record_widths_are_what_the_reference_stores():
    assert (FP8_RECORD_BYTES, FP4_RECORD_BYTES, FP8_BLOCK_BYTES, FP4_BLOCK_BYTES) == (583, 68, 65, 17)


def test_no_module_restates_a_record_width():
    restated = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and type(node.value) is int and node.value in WIDTHS:
                restated.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value}")
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "divmod"
                    and isinstance(node.args[-1], ast.Constant) and node.args[-1].value == FP4_BLOCK_BYTES):
                restated.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: divmod by {FP4_BLOCK_BYTES}")
    assert restated == []
