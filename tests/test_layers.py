"""The package's layers, as csa_conform/layers.txt lists them, and the imports that keep to them (ast).

Every import counts: module level, inside functions (lazy), under TYPE_CHECKING, and in package
``__init__`` files; importing ``a.b.c`` also runs ``a.b``'s ``__init__``. A module may import its
own layer or a lower one, never a higher one, and no set of modules may import each other in a
circle. Only cli/ imports the CLI (the pytest plugin shares the top layer with it but not its code), and the
device runner imports nothing that judges (golden, compare, check, explain).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "csa_conform"



def read_layers(path: Path = PACKAGE / "layers.txt") -> tuple[tuple[str, ...], ...]:
    """The layer listing at the package root, bottom to top ("__init__" stands for the package root)."""
    rows = [line.partition("|")[0].split() for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.startswith("#")]
    return tuple(tuple("" if name == "__init__" else name for name in row) for row in rows)


LAYERS = read_layers()
LAYER_OF = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def module_name(path: Path) -> str:
    parts = ["csa_conform", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imports(name: str, path: Path) -> set[str]:
    """The csa_conform modules (and the packages above them) that running ``name`` imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    named = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            named.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names)
        elif isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
    found = set()
    for target in (target for target in named if target.split(".")[0] == "csa_conform"):
        while target not in MODULES:
            target = target.rpartition(".")[0]
        parts = target.split(".")
        for depth in range(1, len(parts) + 1):
            ancestor = ".".join(parts[:depth])
            if ancestor != name and not name.startswith(ancestor + "."):
                found.add(ancestor)
    return found


GRAPH = {name: imports(name, path) for name, path in MODULES.items()}


def top(name: str) -> str:
    return name.split(".")[1] if "." in name else ""


def test_every_module_has_a_layer():
    assert sorted({top(name) for name in MODULES} - set(LAYER_OF)) == []


def test_no_module_imports_a_higher_layer():
    upward = sorted(f"{name} -> {other}" for name, others in GRAPH.items() for other in others
                    if LAYER_OF[top(other)] > LAYER_OF[top(name)])
    assert upward == []


def test_only_the_cli_imports_the_cli():
    outside = sorted(f"{name} -> {other}" for name, others in GRAPH.items() for other in others
                     if top(other) == "cli" and top(name) not in ("cli", "__main__"))
    assert outside == []


def test_every_listed_package_exists_and_sits_on_one_layer():
    listed = [name for row in LAYERS for name in row]
    assert len(listed) == len(set(listed))
    assert sorted(name for name in listed if name and name not in {top(module) for module in MODULES}) == []


def test_nothing_flat_but_the_error_root():
    flat = sorted(name for name, path in MODULES.items() if name.count(".") == 1 and path.name != "__init__.py")
    assert flat == ["csa_conform.__main__", "csa_conform.errors", "csa_conform.exitcodes"]


def test_the_device_runner_judges_nothing():
    judging = ("golden", "compare", "check", "explain")
    found = sorted(f"{name} -> {other}" for name, others in GRAPH.items() if top(name) == "device"
                   for other in others if top(other) in judging)
    assert found == []


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circle_anywhere():
    assert circles(GRAPH) == []


def test_the_checks_can_fail():
    """A planted circle and a planted upward import are seen (the checks are not vacuous)."""
    assert circles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    planted = {"csa_conform.numerics.fp8": {"csa_conform.cli"}}
    assert any(LAYER_OF[top(other)] > LAYER_OF[top(name)] for name, others in planted.items() for other in others)
    assert "csa_conform.spec" in GRAPH["csa_conform.oracle.pipeline"]


def test_contributing_names_only_paths_that_exist():
    """CONTRIBUTING.md's lists of what a stage or a launch touches name real files and folders."""
    text = (PACKAGE.parent / "CONTRIBUTING.md").read_text(encoding="utf-8")
    named = {word for word in re.findall(r"`([\w./<>-]+/[\w./<>-]*)`", text) if "<" not in word}
    missing = sorted(word for word in named if not ((PACKAGE.parent / word).exists() or (PACKAGE / word).exists()))
    assert named and missing == []
