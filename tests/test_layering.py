"""The import rules of the layout, read from the source with ``ast`` (nothing is imported).

``seedrl/`` is what both sides share: it imports neither ``learner/`` nor ``actors/``.
Actors stay small: they import neither torch nor the learner. The product never
imports ``benchmarks/`` (it is not installed). And no module imports itself back
through others: the module graph has no cycles. Inside ``learner/`` the rooms are
ordered (``ROOMS``) and a module imports only from its own room or the ones under it.
Imports inside functions count, as do ``importlib.import_module("...")`` calls with a
literal name; an import under ``if TYPE_CHECKING:`` counts for the cycles but not for the
rooms' order, as it never runs: a lower room may name the type its caller passes in.
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

ROOMS: tuple[tuple[str, ...], ...] = (
    ("learner.common",),
    ("learner.state",),
    ("learner.population",),
    ("learner.agents",),
    ("learner.training",),
    ("learner.league",),
    ("learner.serving",),
    (
        "learner.parts",
        "learner.checkpointing",
        "learner.run",
        "learner.failover",
        "learner.metrics",
        "learner.collapse",
        "learner.progress",
    ),
    ("learner", "learner.api", "learner.__main__", "learner.tools"),
)
"""The learner's rooms from the bottom up: the neutral base (schedules, the spaces no
model fits, the best checkpoint's measures), what is kept, a population's bookkeeping
(slots to members, exploit and explore over any agent), the agents, training, the
league, serving, the run's assembly, and the doors (commands, the Python API)."""


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


def type_checking_nodes(tree: ast.AST) -> set[ast.AST]:
    """The nodes under ``if TYPE_CHECKING:`` (its ``else`` runs, so is not among them)."""
    nodes: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and (
            (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
            or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")
        ):
            nodes.update(inner for stmt in node.body for inner in ast.walk(stmt))
    return nodes


def imported_names(path: Path, name: str, known: set[str], type_checking: bool = True) -> set[str]:
    """The modules ``path`` (module ``name``) imports; ``from pkg import sub`` names
    ``pkg.sub`` when that is a module of ours; ``type_checking=False`` leaves out those
    under ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    skipped = set() if type_checking else type_checking_nodes(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if node in skipped:
            continue
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


def import_graph(root: Path = ROOT, type_checking: bool = True) -> dict[str, set[str]]:
    modules = source_modules(root)
    known = set(modules)
    return {
        name: imported_names(path, name, known, type_checking) for name, path in modules.items()
    }


def rule_violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, imports in sorted(graph.items()):
        forbidden = FORBIDDEN.get(module.split(".")[0], ())
        for imported in sorted(imports):
            if imported.split(".")[0] in forbidden:
                bad.append(f"{module} imports {imported}")
    return bad


def room(module: str) -> int | None:
    """The rank of ``module``'s room in ``ROOMS`` (None outside ``learner/`` or in no room);
    the longest prefix decides, so ``learner`` itself holds only the package."""
    if module.split(".")[0] != "learner":
        return None
    if module == "learner":
        return len(ROOMS) - 1
    for rank, prefixes in enumerate(ROOMS):
        if any(module == p or module.startswith(p + ".") for p in prefixes if p != "learner"):
            return rank
    return None


def room_violations(graph: dict[str, set[str]]) -> list[str]:
    """A learner module in no room, or one importing from a room above its own."""
    bad = []
    for module, imports in sorted(graph.items()):
        if module.split(".")[0] != "learner":
            continue
        rank = room(module)
        if rank is None:
            bad.append(f"{module} is in no room of ROOMS")
            continue
        for imported in sorted(imports):
            above = room(imported)
            if above is not None and above > rank:
                bad.append(f"{module} imports {imported}, a room above its own")
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


def test_the_learner_rooms_import_only_downhill():
    assert room_violations(import_graph(type_checking=False)) == []


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


@pytest.mark.parametrize(
    ("graph", "violations"),
    [
        ({"learner.state.checkpoint": {"learner.agents.models"}}, 1),
        ({"learner.training.distributed": {"learner.run"}}, 1),
        ({"learner.league.tournament": {"learner.tools.trained_policy"}}, 1),
        ({"learner.agents.base": {"learner.common.schedules", "learner.state.files"}}, 0),
        ({"learner.run": {"learner.parts", "learner.serving.inference", "torch"}}, 0),
        ({"learner": {"learner.api"}, "learner.api": {"learner.tools.local_actors"}}, 0),
        ({"learner.newroom": set()}, 1),
    ],
)
def test_the_room_order_sees_what_it_guards(graph, violations):
    assert len(room_violations(graph)) == violations


def test_only_type_checking_imports_leave_the_room_order(tmp_path):
    source = tmp_path / "host.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from learner.parts import Learner\n"
        "else:\n"
        "    import learner.metrics\n"
        "def serve():\n"
        "    from learner.run import serve\n"
    )
    everything = imported_names(source, "learner.training.host", set())
    running = imported_names(source, "learner.training.host", set(), type_checking=False)
    assert everything - running == {"learner.parts"}
    assert {"learner.metrics", "learner.run"} <= running
