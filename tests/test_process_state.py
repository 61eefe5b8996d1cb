"""No process-wide state: the package's choices travel as arguments, not through the environment.

An environment write leaks into everything the process runs next (a test session's later tests, a
caller's later commands) and into every child it starts. Reading the environment (a user's
documented override) is fine; writing it is allowed only where a child process must see a value
before a library it loads reads it, listed in WRITERS with the reason.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

from csa_conform.oracle.engine import chosen_engine

PACKAGE = Path(__file__).resolve().parents[1] / "csa_conform"
MUTATORS = {"setdefault", "update", "pop", "popitem", "clear", "__setitem__", "__delitem__"}
WRITERS = {
    # A --devices worker owns one GPU: CUDA reads CUDA_VISIBLE_DEVICES when it starts in that worker.
    "device/devices.py": {"CUDA_VISIBLE_DEVICES"},
    # Under a tight ulimit -v, OpenBLAS must start one thread; it reads the variable when numpy loads.
    "__main__.py": {"OPENBLAS_NUM_THREADS"},
}


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name)
            and node.value.id == "os")


def _key(node: ast.AST) -> str:
    if isinstance(node, ast.Constant):
        return str(node.value)
    return ast.unparse(node)


def environment_writes(tree: ast.AST, constants: dict[str, str]) -> list[str]:
    """The variable names (or key expressions) a module assigns, deletes or mutates in os.environ."""
    writes = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
        for target in targets:
            if isinstance(target, ast.Subscript) and _is_environ(target.value):
                writes.append(_key(target.slice))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if _is_environ(node.func.value) and node.func.attr in MUTATORS:
                writes.append(_key(node.args[0]) if node.args else node.func.attr)
            if (isinstance(node.func.value, ast.Name) and node.func.value.id == "os"
                    and node.func.attr in ("putenv", "unsetenv")):
                writes.append(_key(node.args[0]) if node.args else node.func.attr)
    return [constants.get(write, write) for write in writes]


def _constants(tree: ast.AST) -> dict[str, str]:
    """Module-level NAME = "string" bindings, so a write through a named constant names its variable."""
    return {target.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            for target in node.targets if isinstance(target, ast.Name)}


def package_writes() -> dict[str, set[str]]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        writes = environment_writes(tree, _constants(tree))
        if writes:
            found[path.relative_to(PACKAGE).as_posix()] = set(writes)
    return found


def test_no_module_writes_the_environment_except_the_listed_child_process_settings():
    assert package_writes() == WRITERS


def test_the_check_sees_every_form_of_write():
    source = ("import os\nNAME = 'CSA_CONFORM_ENGINE'\nos.environ[NAME] = 'numpy'\nos.environ.setdefault('A', '1')\n"
              "os.environ.update(B='2')\ndel os.environ['C']\nos.putenv('D', '3')\nos.environ.get('E')\n")
    tree = ast.parse(source)
    assert sorted(environment_writes(tree, _constants(tree))) == ["A", "C", "CSA_CONFORM_ENGINE", "D", "update"]


def test_an_engine_choice_is_returned_not_written(monkeypatch):
    monkeypatch.delenv("CSA_CONFORM_ENGINE", raising=False)
    before = dict(os.environ)
    assert chosen_engine("numpy") == "numpy"
    assert chosen_engine(None) is None
    assert dict(os.environ) == before
