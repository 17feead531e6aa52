"""Capabilities are asked of an agent, never read off its name: no code outside the
registry compares a value with a registered ``--agent`` name."""

from __future__ import annotations

import ast
from pathlib import Path

import learner  # noqa: F401  (registers the agents)
from learner.agents.registry import AGENTS

ROOT = Path(__file__).resolve().parent.parent
REGISTRY = ROOT / "learner" / "agents" / "registry.py"


def name_comparisons(tree: ast.AST, names: set[str]) -> list[int]:
    """Lines of ``x == "name"``, ``x != "name"``, ``x in ("name", ...)`` and the like."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for operand in operands:
            elements = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else []
            for value in (operand, *elements):
                if isinstance(value, ast.Constant) and value.value in names:
                    found.append(node.lineno)
    return found


def test_no_code_outside_the_registry_compares_with_an_agent_name() -> None:
    names = set(AGENTS)
    offenders = []
    for package in ("learner", "seedrl", "actors"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == REGISTRY:
                continue
            for line in name_comparisons(ast.parse(path.read_text()), names):
                offenders.append(f"{path.relative_to(ROOT)}:{line}")
    assert not offenders, f"agent names compared outside the registry: {offenders}"


def test_the_scan_finds_a_comparison_with_an_agent_name() -> None:
    tree = ast.parse('if config.agent != "r2d2" or kind in ("vtrace", "x"):\n    pass\n')
    assert name_comparisons(tree, {"r2d2", "vtrace"}) == [1, 1]
    assert name_comparisons(ast.parse('agent = "r2d2"'), {"r2d2"}) == []
