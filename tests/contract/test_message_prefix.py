"""The operator prefix of a rejection is built in one place (csa_conform/errors.py), so it cannot drift."""

import re
from pathlib import Path

import pytest

import csa_conform
from csa_conform.errors import OP, ContractError, invalid, operator_message, unsupported

PACKAGE = Path(csa_conform.__file__).parent
HAND_BUILT = re.compile(r"\{OP\}: |Unsupported: |CompressedSparseAttention: ")


def test_only_errors_builds_the_operator_prefix():
    builders = sorted(str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
                      if HAND_BUILT.search(path.read_text(encoding="utf-8")))
    assert builders == ["errors.py"]


@pytest.mark.parametrize("build, kind, text", [
    (invalid, "invalid", f"{OP}: query is NaN"),
    (unsupported, "unsupported", f"{OP}: Unsupported: query is NaN"),
])
def test_the_kind_and_the_prefix_come_together(build, kind, text):
    error = build("query is NaN")
    assert isinstance(error, ContractError)
    assert (str(error), error.kind) == (text, kind)
    assert operator_message("query is NaN", kind) == text
