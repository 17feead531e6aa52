"""No measurement figures in code or ``--help``: comments and docstrings say why.

Figures (µs, frames/s, A/B pairs, percentages, dates, "round" names) go stale on the next
machine; they belong in ``docs/performance.md`` and ``docs/logs/performance-log.md``, next to
the command that reproduces them. This test reads every comment and docstring of the
installed packages (``seedrl/``, ``learner/``, ``actors/``; ``benchmarks/`` is exempt)
and the ``--help`` text of the two command lines, and names each figure it finds.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("seedrl", "learner", "actors")
ORDINALS = "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth"

FIGURE = re.compile(
    "|".join(
        (
            r"µs",  # microseconds
            r"\d\s?us\b",  # microseconds spelled in ASCII
            r"frames/s",
            r"\d[\d.,]*k?\s?fps\b",
            r"\d+(?:\.\d+)?k\b",  # "19.4k frames"
            r"\d\s?%",  # percentages ("K % G" has no digit before the sign)
            r"\d\s?(?:ms|MB|KB|GB)\b",  # measured times and sizes
            r"\bA/B\b",
            r"\d[\d.,]*\s?(?:->|→|against|vs\.?)\s?~?\d",  # before -> after pairs
            r"\d(?:\.\d+)?\s?[x×]\s(?:faster|slower|cheaper|more|less)\b",
            r"\d{4}-\d{2}-\d{2}",  # dates
            r"\brounds?\b(?![- ](?:trip|robin))",  # measurement rounds, not round trips
            rf"\b(?:{ORDINALS})\s+round",
        )
    ),
    re.IGNORECASE,
)


def figures(text: str) -> list[str]:
    """Every figure in ``text`` (whitespace normalised, so a line break hides nothing)."""
    return [m.group(0) for m in FIGURE.finditer(" ".join(text.split()))]


def comment_and_docstring_blocks(source: str) -> Iterator[tuple[int, str]]:
    """(first line, text) of each run of consecutive comment lines and of each bare string
    statement (module, class, function and attribute docstrings)."""
    block: list[str] = []
    start = last = 0
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        line = tok.start[0]
        if block and line != last + 1:
            yield start, " ".join(block)
            block = []
        if not block:
            start = line
        block.append(tok.string.lstrip("#"))
        last = line
    if block:
        yield start, " ".join(block)
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            yield node.lineno, node.value.value


def code_files() -> list[Path]:
    files = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if not rel.startswith("seedrl/proto/"):
                files.append(path)
    return files


def test_the_pattern_catches_figures_and_spares_plain_words() -> None:
    caught = [
        "a batch took 24 µs",
        "64 x K=1: +7-13 % frames/s",
        "from 19.4k to 28.0k",
        "(2026-11-26, medians of three interleaved rounds)",
        "the twelfth round's change",
        "4 -> 12 ms took the learner from ~370 to ~315",
        "~3x cheaper in CPU",
        "PSS 28 -> 10 MB an actor",
        "one 25 us step",
    ]
    for text in caught:
        assert figures(text), text
    spared = [
        "one round trip per env step, round robin over the CPUs",
        "K % G == 0; rounded up: with up to 9 streams, all of them",
        "keys frames, fps and episode_return_mean",
        "at most 2 s, then the stream ends",
    ]
    for text in spared:
        assert not figures(text), text


def test_comments_and_docstrings_carry_no_figures() -> None:
    found = []
    for path in code_files():
        rel = path.relative_to(ROOT).as_posix()
        for line, text in comment_and_docstring_blocks(path.read_text()):
            found += [f"{rel}:{line}: {figure!r}" for figure in figures(text)]
    assert not found, "figures belong in docs/performance*.md:\n" + "\n".join(found)


HELP_COMMANDS = (
    ("learner", "--help"),
    ("learner", "train", "--help"),
    ("learner", "demo", "--help"),
    ("learner", "evaluate", "--help"),
    ("learner", "plot", "--help"),
    ("learner", "healthcheck", "--help"),
    ("actors", "--help"),
    ("actors", "actor", "--help"),
)
"""Every command of the product; ``learner bench`` runs benchmarks/, which is exempt."""


@pytest.fixture(scope="module")
def help_texts() -> dict[tuple[str, ...], str]:
    """The ``--help`` output of each command, run in parallel."""
    procs = {
        cmd: subprocess.Popen(
            [sys.executable, "-m", *cmd],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for cmd in HELP_COMMANDS
    }
    texts = {}
    for cmd, proc in procs.items():
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}: {out}"
        texts[cmd] = out
    return texts


@pytest.mark.parametrize("cmd", HELP_COMMANDS, ids=" ".join)
def test_help_carries_no_figures(cmd: tuple[str, ...], help_texts: dict) -> None:
    text = help_texts[cmd]
    assert "usage:" in text
    assert not figures(text), f"python -m {' '.join(cmd)}: {figures(text)}"
