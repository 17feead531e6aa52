"""The generated blocks of the docs: a benchmark's table lives between its two markers."""

from __future__ import annotations

from pathlib import Path


def replace_block(path: Path, begin: str, end: str, block: str) -> None:
    """Replace the text between ``begin`` and ``end`` in ``path`` with ``block``; a page
    without both markers stops the command, since a table would otherwise go nowhere."""
    text = path.read_text()
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        raise SystemExit(f"{path}: no {begin} ... {end} markers")
    path.write_text(text[: start + len(begin)] + "\n" + block + text[stop:])
