"""``python -m seedrl.conformance``: test an actor or a learner against the wire protocol.

    python -m seedrl.conformance actor [flags] -- CMD ...     a scripted learner tests CMD
    python -m seedrl.conformance learner HOST:PORT [flags]    a scripted actor tests a learner
    python -m seedrl.conformance cases [--update PAGE]         list the cases (or write
                                                               docs/conformance.md's tables)

In CMD, ``{learner}`` becomes the address to dial; ``{num_envs}``, ``{max_backoff_s}`` and
``{token}`` the suite's values (the token also comes as $SEEDRL_AUTH_TOKEN). Exit status
0 when every case passed or was skipped, 1 when one failed, 2 for a usage error.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from seedrl.cli import parse_config
from seedrl.conformance.cases import CASES, Report, markdown, update_page
from seedrl.conformance.config import ActorSuiteConfig, LearnerSuiteConfig

USAGE = __doc__ or ""


def _finish(report: Report, report_json: str) -> int:
    print(report.text(), flush=True)
    if report_json:
        Path(report_json).write_text(report.dumps())
    return 0 if report.ok else 1


def actor_main(argv: list[str]) -> int:
    if "--" not in argv:
        sys.stderr.write("python -m seedrl.conformance actor: give the actor command after --\n")
        return 2
    split = argv.index("--")
    flags, command = argv[:split], argv[split + 1 :]
    config = parse_config(
        ActorSuiteConfig,
        flags,
        "python -m seedrl.conformance actor [flags] --",
        "A scripted learner tests an actor command (the rest of the line after --).",
    )
    from seedrl.conformance.actor_suite import run_actor_suite

    try:
        report = run_actor_suite(command, config)
    except ValueError as exc:
        sys.stderr.write(f"python -m seedrl.conformance actor: {exc}\n")
        return 2
    return _finish(report, config.report_json)


def learner_main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        sys.stderr.write("python -m seedrl.conformance learner: give HOST:PORT first\n")
        return 2
    target, flags = argv[0], argv[1:]
    config = parse_config(
        LearnerSuiteConfig,
        flags,
        "python -m seedrl.conformance learner HOST:PORT",
        "A scripted actor tests the learner at HOST:PORT.",
    )
    from seedrl.conformance.learner_suite import run_learner_suite

    try:
        report = run_learner_suite(target, config)
    except ValueError as exc:
        sys.stderr.write(f"python -m seedrl.conformance learner: {exc}\n")
        return 2
    return _finish(report, config.report_json)


def cases_main(argv: list[str]) -> int:
    """List the cases; ``--update PAGE`` rewrites PAGE's generated case tables instead."""
    if argv[:1] == ["--update"] and len(argv) == 2:
        page = Path(argv[1])
        try:
            page.write_text(update_page(page.read_text(), markdown()))
        except (OSError, ValueError) as exc:
            sys.stderr.write(f"python -m seedrl.conformance cases: {page}: {exc}\n")
            return 2
        print(f"updated {page}")
        return 0
    if argv:
        sys.stderr.write("python -m seedrl.conformance cases [--update PAGE]\n")
        return 2
    for case in CASES.values():
        print(f"{case.side:7}  {case.id:28}  {case.summary}")
    return 0


COMMANDS = {"actor": actor_main, "learner": learner_main, "cases": cases_main}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in COMMANDS:
        sys.stderr.write(USAGE)
        return 0 if args and args[0] in ("-h", "--help") else 2
    logging.basicConfig(
        level=os.environ.get("SEEDRL_LOG_LEVEL", "WARNING"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return COMMANDS[args[0]](args[1:])


if __name__ == "__main__":
    sys.exit(main())
