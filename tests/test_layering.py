"""The import rules of the layout, read from the source with ``ast`` (nothing is imported).

``seedrl/`` is what both sides share: it imports neither ``learner/`` nor ``actors/``.
Actors stay small: they import neither torch nor the learner. The product never
imports ``benchmarks/`` (it is not installed). And no module imports itself back
through others: the module graph has no cycles. Imports inside functions count, as
do ``importlib.import_module("...")`` calls with a literal name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from support import ROOT

PACKAGES = ("seedrl", "learner", "actors", "benchmarks")
FORBIDDEN = {
    "seedrl": ("learner", "actors", "benchmarks", "torch"),
    "actors": ("learner", "torch", "benchmarks"),
    "learner": ("benchmarks",),
}
"""Package -> the top-level names its modules must never import."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the four packages (the generated protobuf code included)."""
    return {
        module_name(path): path
        for package in PACKAGES
        for path in sorted((root / package).rglob("*.py"))
    }


def imported_names(path: Path, name: str, known: set[str]) -> set[str]:
    """The modules ``path`` (module ``name``) imports; ``from pkg import sub`` names
    ``pkg.sub`` when that is a module of ours."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.add(sub if sub in known else module)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.add(node.args[0].value)
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    modules = source_modules(root)
    known = set(modules)
    return {name: imported_names(path, name, known) for name, path in modules.items()}


def rule_violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, imports in sorted(graph.items()):
        forbidden = FORBIDDEN.get(module.split(".")[0], ())
        for imported in sorted(imports):
            if imported.split(".")[0] in forbidden:
                bad.append(f"{module} imports {imported}")
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), among our modules.

    A module's import of its own parent package is left out: Python runs a package's
    ``__init__`` before any of its modules anyway, so that edge adds no order.
    """
    edges = {
        m: {i for i in imports if i in graph and i != m and not m.startswith(i + ".")}
        for m, imports in graph.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_layers_import_only_downhill():
    assert rule_violations(import_graph()) == []


def test_no_module_imports_itself_back():
    assert cycles(import_graph()) == []


@pytest.mark.parametrize(
    ("graph", "violations", "cycle"),
    [
        ({"seedrl.codec": {"learner.run"}, "learner.run": set()}, 1, 0),
        ({"actors.actor": {"torch.nn"}}, 1, 0),
        ({"actors.a": {"actors.b"}, "actors.b": {"actors.c"}, "actors.c": {"actors.a"}}, 0, 1),
        ({"learner": {"learner.api"}, "learner.api": {"learner"}}, 0, 0),
    ],
)
def test_the_checks_see_what_they_guard(graph, violations, cycle):
    assert len(rule_violations(graph)) == violations
    assert len(cycles(graph)) == cycle
