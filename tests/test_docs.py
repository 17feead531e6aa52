"""The README stays a short map whose links and named paths exist; docs/ has its pages."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = (
    "architecture.md",
    "wire-protocol.md",
    "conformance.md",
    "actors-in-other-languages.md",
    "configuration.md",
    "usage.md",
    "deployment.md",
    "reliability.md",
    "performance.md",
    "performance-log.md",
)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def test_readme_is_short() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move depth to docs/"


def test_readme_links_every_docs_page() -> None:
    text = README.read_text()
    for page in PAGES:
        assert (ROOT / "docs" / page).is_file(), f"docs/{page} is missing"
        assert f"(docs/{page}" in text, f"README.md does not link docs/{page}"


def test_relative_links_resolve() -> None:
    for doc in (README, *sorted((ROOT / "docs").glob("*.md"))):
        for target in LINK.findall(doc.read_text()):
            if "://" in target:
                continue
            assert (doc.parent / target).exists(), f"{doc.relative_to(ROOT)} links {target}"


def test_the_repository_map_names_paths_that_exist() -> None:
    table = _section(README.read_text(), "Repository contents")
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert len(rows) > 10
    for row in rows:
        first_cell = row.split(" | ")[0]
        for path in re.findall(r"`([^`]+)`", first_cell):
            assert (ROOT / path).exists(), f"README's map names {path}, which does not exist"
