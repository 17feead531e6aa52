"""``python -m actors [actor] [flags]``: the actors' one command line.

Subcommands (a dispatch table; none given means ``launch``):
  launch   start N actors in processes and supervise them (``actors.launcher``)
  actor    run ONE actor process, as the launcher's exec mode starts it (``actors.process``)
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

SUBCOMMANDS = {
    "launch": "actors.launcher",
    "actor": "actors.process",
}
"""Subcommand -> the module whose ``main(argv)`` runs it."""
DEFAULT = "launch"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    name = args.pop(0) if args and args[0] in SUBCOMMANDS else DEFAULT
    return int(importlib.import_module(SUBCOMMANDS[name]).main(args))


if __name__ == "__main__":
    sys.exit(main())
