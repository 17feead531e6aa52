"""docs/usage.md's table of env families, written from :data:`seedrl.envs.registry.FAMILIES`.

``python -m seedrl.envs.docs docs/usage.md`` (part of ``make docs``) rewrites the block
between the markers; ``tests/test_env_registry.py`` fails while the committed table is
stale, so the page always says what the registry does.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from seedrl.envs.family import EnvFamily
from seedrl.envs.registry import FAMILIES

BEGIN = "<!-- env-families:begin -->"
END = "<!-- env-families:end -->"
COMMAND = "python -m seedrl.envs.docs docs/usage.md"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _install(family: EnvFamily) -> str:
    if family.extra is None:
        return "base install"
    return f"`make install EXTRAS={family.extra}` or `pip install -e '.[{family.extra}]'`"


def _conventions(family: EnvFamily) -> str:
    notes = []
    if family.frame_stack is not None:
        notes.append("stacked frames: actors send only the newest")
    if family.evaluation_kwargs:
        forced = ", ".join(f"`{k}={v!r}`" for k, v in family.evaluation_kwargs.items())
        notes.append(f"`evaluate` scores with {forced}")
    if family.frames_per_step > 1:
        notes.append(f"one agent step is {family.frames_per_step} emulator frames")
    return "; ".join(notes) or "—"


def _example(family: EnvFamily) -> str:
    preset = f"--preset {family.preset} " if family.preset else ""
    return f"`python -m learner {preset}--env {family.example}`"


def render() -> str:
    """The Markdown block: provenance, then one row per family in matching order."""
    lines = [
        f"<!-- Generated from seedrl/envs/registry.py by `{COMMAND}` (or `make docs`). -->",
        "",
        "| family | ids | install | what seedrl does to it | conventions | example |",
        "|---|---|---|---|---|---|",
    ]
    for f in FAMILIES:
        cells = (f.title, f.ids, _install(f), f.preprocessing, _conventions(f), _example(f))
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def update_page(page: str, block: str) -> str:
    """``page`` with the text between the markers replaced by ``block``."""
    first, last = page.find(BEGIN), page.find(END)
    if first < 0 or last < first:
        raise ValueError(f"the page has no {BEGIN} ... {END} block")
    return page[: first + len(BEGIN)] + "\n" + block + page[last:]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m seedrl.envs.docs", description=__doc__)
    parser.add_argument("page", nargs="?", help="the page to update (default: print the block)")
    args = parser.parse_args(argv)
    if args.page is None:
        sys.stdout.write(render())
        return 0
    page = Path(args.page)
    try:
        page.write_text(update_page(page.read_text(), render()))
    except (OSError, ValueError) as exc:
        parser.exit(2, f"{parser.prog}: error: {page}: {exc}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
