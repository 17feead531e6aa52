"""``python -m learner.tools.config_docs > docs/configuration.md``: the flags' reference
page, with a table for each registered agent's knobs (:mod:`seedrl.config_docs` renders
it; the agents are the learner's, so the learner writes it)."""

from __future__ import annotations

import sys

from learner.agents.registry import agent_sections
from seedrl.config_docs import render


def main(argv: list[str] | None = None) -> int:
    sys.stdout.write(render(agent_sections()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
