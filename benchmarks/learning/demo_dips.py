"""``python -m benchmarks.learning.demo_dips``: ``make demo`` over several seeds, and
whether each run's mean-100 return halved on its way to solving (docs/learning.md).

    python -m benchmarks.learning.demo_dips run --seeds 10 --label "cartpole preset" \\
        --out benchmarks/results/demo-dips.json [-- --max-update-kl 0.02 ...]
    python -m benchmarks.learning.demo_dips table benchmarks/results/demo-dips.json \\
        --update docs/learning.md

The demo's curve is the first picture a newcomer sees, so a run that climbs, falls to
half and climbs again reads as a broken system even when it solves. ``run`` starts the
real demo (learner and actor processes, as ``make demo`` does) once per seed with the
learner's metrics written every half second, and keeps each run's curve and verdict;
runs of several labels (settings) add up in one JSON, one table row per label.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.doc_blocks import replace_block
from seedrl.metrics import read_metrics

SCHEMA = "seedrl-demo-dips/1"
RISEN = 200.0
"""A run's curve is watched for a fall once its mean-100 first reaches this."""
FALL = 0.5
"""A halving: the mean-100 at or below this fraction of its best so far."""
SOLVED = 475.0
"""The demo's own --target-return: where a run stops and its curve stops being read."""
LOG_INTERVAL_S = 0.5
"""The demo learner's metrics interval here: fine enough to see a dip of a few seconds."""
TABLE_START, TABLE_END = "<!-- demo-dips:start -->", "<!-- demo-dips:end -->"


@dataclass(frozen=True)
class Fall:
    """The deepest fall of a curve after it first reached :data:`RISEN`, before solving."""

    peak: float
    """The best mean-100 before the low point."""
    low: float
    """The lowest mean-100 after that peak."""

    @property
    def halved(self) -> bool:
        return self.low <= FALL * self.peak


def deepest_fall(curve: Sequence[tuple[int, float]], solved_at: float) -> Fall | None:
    """The deepest relative fall of ``curve`` ((frames, mean-100) in order) between its
    first point at or above :data:`RISEN` and its first at or above ``solved_at``; None if
    it never reached :data:`RISEN`."""
    peak, worst = None, None
    for _, value in curve:
        if peak is None:
            if value < RISEN:
                continue
            peak = value
        if value >= solved_at:
            break
        peak = max(peak, value)
        if worst is None or value / peak < worst.low / worst.peak:
            worst = Fall(peak, value)
    if peak is None:
        return None
    return worst if worst is not None else Fall(peak, peak)


def read_curve(logdir: Path) -> list[tuple[int, float]]:
    """(frames, mean-100 return) of every metrics record that has a return."""
    return [
        (int(record["frames"]), float(record["episode_return_mean"]))
        for record in read_metrics(logdir)
        if record.get("episode_return_mean") is not None and "frames" in record
    ]


def run_one(seed: int, workdir: Path, extra: Sequence[str], max_seconds: float) -> dict[str, Any]:
    """One demo run of ``seed``: its verdict, frames and seconds to solve, and its curve."""
    logdir = workdir / f"seed{seed}"
    cmd = [
        sys.executable, "-m", "learner", "demo", "--seed", str(seed), "--logdir", str(logdir),
        "--max-seconds", str(max_seconds), "--", "--log-interval-s", str(LOG_INTERVAL_S),
        "--no-tensorboard", *extra,
    ]  # fmt: skip
    began = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max_seconds + 120)
    result_path = logdir / "result.json"
    if not result_path.exists():
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:]
        raise RuntimeError(f"seed {seed}: the demo wrote no result ({' '.join(tail)})")
    result = json.loads(result_path.read_text())
    curve = read_curve(logdir)
    fall = deepest_fall(curve, SOLVED)
    return {
        "seed": seed,
        "solved": bool(result["solved"]),
        "frames": int(result["frames"]),
        "wall_time_s": float(result["wall_time_s"]),
        "command_s": time.monotonic() - began,
        "fall": None if fall is None else {"peak": fall.peak, "low": fall.low},
        "halved": bool(fall is not None and fall.halved),
        "curve": curve,
    }


def cmd_run(args: argparse.Namespace) -> int:
    extra = [a for a in args.learner_args if a != "--"]
    out = Path(args.out)
    doc: dict[str, Any] = {"schema": SCHEMA, "rows": []}
    if out.exists():
        doc = json.loads(out.read_text())
    if doc.get("schema") != SCHEMA:
        raise SystemExit(f"error: {out} is not a {SCHEMA} file")
    runs = []
    with tempfile.TemporaryDirectory(prefix="demo-dips-") as tmp:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            run = run_one(seed, Path(tmp), extra, args.max_seconds)
            fall = run["fall"]
            print(
                f"{args.label} seed {seed}: {'solved' if run['solved'] else 'NOT solved'} at "
                f"{run['frames']:,} frames, {run['wall_time_s']:.1f} s; deepest fall "
                + ("-" if fall is None else f"{fall['peak']:.0f} -> {fall['low']:.0f}")
                + (" (halved)" if run["halved"] else ""),
                flush=True,
            )
            runs.append(run)
    doc["rows"] = [r for r in doc["rows"] if r["label"] != args.label]
    doc["rows"].append(
        {
            "label": args.label,
            "learner_args": extra,
            "date": time.strftime("%Y-%m-%d"),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "runs": runs,
        }
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(render_table(doc))
    return 0


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def render_table(doc: dict[str, Any]) -> str:
    """One row per label: seeds, solved, halved after passing 200, the median frames and
    seconds to solve (an unsolved run counts as never solving)."""
    lines = [
        "| settings (learner flags beside the demo's `--preset cartpole` as the row was run) | "
        "seeds | solved | halved after "
        f"passing {RISEN:.0f} | median frames to solve | median seconds to solve | "
        "frames to solve, min-max | date, machine |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in doc["rows"]:
        runs = row["runs"]
        never = float("inf")
        frames = [r["frames"] if r["solved"] else never for r in runs]
        seconds = [r["wall_time_s"] if r["solved"] else never for r in runs]
        solved = [r["frames"] for r in runs if r["solved"]]
        span = f"{min(solved):,}-{max(solved):,}" if solved else "-"
        flags = " ".join(row["learner_args"]) or "none"
        med_f, med_s = _median(frames), _median(seconds)
        lines.append(
            f"| {row['label']}: `{flags}` | {len(runs)} | {len(solved)} | "
            f"{sum(r['halved'] for r in runs)} | "
            f"{'never' if med_f == never else f'{med_f:,.0f}'} | "
            f"{'never' if med_s == never else f'{med_s:.1f}'} | {span} | "
            f"{row['date']}, {row['machine']} |"
        )
    return "\n".join(lines)


def cmd_table(args: argparse.Namespace) -> int:
    doc = json.loads(Path(args.file).read_text())
    table = render_table(doc)
    if args.update is None:
        print(table)
        return 0
    replace_block(Path(args.update), TABLE_START, TABLE_END, table + "\n")
    print(f"updated {args.update}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.learning.demo_dips", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="the demo once per seed, appended to --out")
    run.add_argument("--seeds", type=int, default=10)
    run.add_argument("--first-seed", type=int, default=0)
    run.add_argument(
        "--label", required=True, help="the row's name (a label run again is replaced)"
    )
    run.add_argument("--out", default="benchmarks/results/demo-dips.json")
    run.add_argument("--max-seconds", type=float, default=300.0)
    run.add_argument("learner_args", nargs=argparse.REMAINDER, help="learner flags after --")
    table = sub.add_parser("table", help="the table of a demo-dips JSON")
    table.add_argument("file")
    table.add_argument("--update", help="a Markdown file whose demo-dips block to replace")
    args = parser.parse_args(argv)
    return cmd_run(args) if args.command == "run" else cmd_table(args)


if __name__ == "__main__":
    sys.exit(main())
