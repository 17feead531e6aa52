"""``python -m benchmarks.soak``: train for a long while with faults on a schedule.

``run`` (the default) soaks, writes the result JSON and its plot, and exits 1 when a
bound broke; ``table FILE --update docs/reliability.md [--png PATH]`` renders a result
as the page's soak block. See :mod:`benchmarks.soak`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.bench.report import machine_info
from benchmarks.soak import report
from benchmarks.soak.run import Soak, SoakConfig
from seedrl.cli import field_docs

SCHEMA = "seedrl-soak/1"
SHORT = {
    "minutes": 0.0, "once": True, "warmup_s": 45.0, "settle_s": 8.0, "quiet_end_s": 45.0,
    "checkpoint_interval_s": 5.0, "partition_s": 20.0, "serving_processes": 2,
}  # fmt: skip
"""``--short``: every fault kind once, back to back (a few minutes: CI's version), the
learners serving through two frontend processes (so a frontend's kill is among them)."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.soak",
        description="Train with local actors while faults come on a schedule (actor and "
        "learner kills, a corrupt checkpoint, a trainer crash, a network partition, a full "
        "disk, a fail-over to a standby learner); check recovery, frames lost, RSS, streams, "
        "checkpoints, return.",
    )
    docs = field_docs(SoakConfig)
    for field in dataclasses.fields(SoakConfig):
        flag = "--" + field.name.replace("_", "-")
        if field.type in ("bool", bool):
            p.add_argument(flag, action="store_true", help=docs.get(field.name))
        else:
            kind = int if field.type in ("int", int) else (str if field.name == "env" else float)
            p.add_argument(flag, type=kind, default=field.default, help=docs.get(field.name))
    p.add_argument("--short", action="store_true", help="every fault kind once (CI's version)")
    p.add_argument("--out", default="benchmarks/results/soak.json", help="result JSON")
    p.add_argument("--png", default="docs/reliability/soak.png", help="the plot")
    p.add_argument("--work", default="", help="work directory (default: a temp one)")
    return p


def run(argv: Sequence[str]) -> int:
    args = _parser().parse_args(argv)
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(SoakConfig)}
    if args.short:
        values.update(SHORT)
    config = SoakConfig(**values)
    work = Path(args.work or tempfile.mkdtemp(prefix="seedrl-soak-"))
    work.mkdir(parents=True, exist_ok=True)

    def say(line: str) -> None:
        print(line, flush=True)

    soak = Soak(config, work, say)

    def interrupt(signum: int, frame: object) -> None:
        say(f"soak: {signal.Signals(signum).name}: ending after the fault under way")
        soak.interrupted = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, interrupt)
    started_wall = time.time()
    error = None
    try:
        soak.run()
    except Exception as exc:  # the run so far is still reported, and judged broken
        traceback.print_exc()
        error = repr(exc)
    finally:
        stopped_wall = time.time()
        soak.stop()
        final_frames = soak.checkpoint_frames()
        records = soak.metrics.poll()
        soak.close()
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "date": time.strftime("%Y-%m-%d", time.gmtime(started_wall)),
        "command": "python -m benchmarks.soak " + shlex.join(argv),
        "machine": machine_info(),
        "config": dataclasses.asdict(config),
        "actors": soak.actors_total,
        "started_wall": started_wall,
        "stopped_wall": stopped_wall,
        "duration_s": round(stopped_wall - started_wall, 1),
        "interrupted": soak.interrupted,
        "error": error,
        "skipped": soak.skipped,
        "faults": soak.faults,
        "rss": soak.rss.samples,
        "records": report.thin(records, 5.0),
        "final_checkpoint_frames": final_frames,
        "work": str(work),
    }
    result["checks"] = report.judge(result)
    result["ok"] = error is None and all(c["ok"] for c in result["checks"].values())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    if args.png:
        report.plot(result, Path(args.png))
    for name, check in result["checks"].items():
        print(f"soak check {name}: {'ok' if check['ok'] else 'BROKEN'} {json.dumps(check)}")
    print(f"soak: {'all bounds held' if result['ok'] else 'a bound broke'}; wrote {out}")
    return 0 if result["ok"] else 1


def table(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak table")
    p.add_argument("result", help="a soak result JSON")
    p.add_argument("--update", default=None, help="rewrite this page's soak block")
    p.add_argument("--png", default=None, help="the plot's path as the page links it")
    args = p.parse_args(argv)
    result = json.loads(Path(args.result).read_text())
    block = report.render(result, args.png)
    if args.update:
        report.update_doc(Path(args.update), block)
    else:
        print(block, end="")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "table":
        return table(args[1:])
    if args and args[0] == "run":
        args = args[1:]
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
