"""The shape of ``seedrl/config.py``: no function over 60 lines, so a section's checks stay
readable where they are kept (the learner's checks are one function per section)."""

from __future__ import annotations

import ast

from support import ROOT

CONFIG = ROOT / "seedrl" / "config.py"
MAX_LINES = 60


def long_functions(source: str) -> list[str]:
    """``name (N lines)`` for each function of ``source`` longer than :data:`MAX_LINES`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            lines = (node.end_lineno or node.lineno) - start + 1
            if lines > MAX_LINES:
                found.append(f"{node.name} ({lines} lines)")
    return found


def test_no_function_in_the_config_module_is_over_60_lines() -> None:
    assert long_functions(CONFIG.read_text()) == []


def test_a_long_function_is_found() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    assert long_functions(f"def f():\n{body}\n") == [f"f ({MAX_LINES + 1} lines)"]
