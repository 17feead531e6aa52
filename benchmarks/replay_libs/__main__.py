"""``python -m benchmarks.replay_libs``: seedrl's numpy sum tree beside the prioritized
replays of two well-kept libraries (cpprb, torchrl), on the R2D2 learner's work at the
replay sizes the presets give, to decide whether seedrl should keep its own.

    python -m benchmarks.replay_libs run [--out benchmarks/results/replay-libs.json]
    python -m benchmarks.replay_libs table benchmarks/results/replay-libs.json \
        [--update docs/performance.md]

``run`` builds the libraries' environment on first use (``benchmarks.peers.venvs``, the
``replay-libs`` pins: neither library is a seedrl dependency), times each implementation
in its own process (``driver.py``), one at a time, and writes the JSON; ``table``
renders it between the ``replay-libs`` markers of the page.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.peers import venvs
from benchmarks.results_table import _num, write_block

DRIVER = Path(__file__).resolve().with_name("driver.py")
DEFAULT_OUT = Path("benchmarks/results/replay-libs.json")
SCHEMA = "seedrl-replay-libs/1"
BEGIN = "<!-- replay-libs:begin -->"
END = "<!-- replay-libs:end -->"
SIZES = {
    "minatar-r2d2": 300_000 // 31,
    "classic-r2d2": 100_000 // 13,
    "atari-r2d2": 4_000_000 // 121,
    "R2D2 paper": 4_000_000 // 40,
}
"""Replay capacity in sequences of each R2D2 preset: its --replay-frames over the rows a
stored sequence holds (burn-in + unroll + 1; Atari's on the default --replay-bytes holds
fewer), and the paper's: 4 M observations in sequences that each add 40 new ones."""
IMPLS = ("seedrl", "cpprb", "torchrl")
DRIVER_TIMEOUT_S = 600.0


def run(args: argparse.Namespace) -> int:
    libs = venvs.ensure("replay-libs", Path(args.venv_root), Path(args.out).with_suffix(".log"))
    rows: list[dict[str, Any]] = []
    for preset, capacity in SIZES.items():
        for impl in IMPLS:
            python = sys.executable if impl == "seedrl" else str(libs.python)
            cmd = [python, str(DRIVER), "--impl", impl, "--capacity", str(capacity),
                   "--add", str(args.add), "--batch", str(args.batch),
                   "--rounds", str(args.rounds)]  # fmt: skip
            env = dict(os.environ, OMP_NUM_THREADS="1")
            done = subprocess.run(cmd, capture_output=True, text=True, env=env,
                                  timeout=DRIVER_TIMEOUT_S, check=False)  # fmt: skip
            if done.returncode != 0:
                tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
                row: dict[str, Any] = {"impl": impl, "capacity": capacity, "error": tail[0]}
            else:
                row = json.loads(done.stdout.strip().splitlines()[-1])
            row["preset"] = preset
            rows.append(row)
            print(json.dumps(row), flush=True)
    result = {
        "schema": SCHEMA,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}",
        "load": os.getloadavg()[0],
        "batch": args.batch,
        "add": args.add,
        "rounds": args.rounds,
        "versions": {k: libs.versions.get(k, "") for k in ("cpprb", "torchrl", "torch", "numpy")},
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


def markdown(result: dict[str, Any]) -> str:
    """The JSON as a Markdown table: per preset size, each implementation's median
    microseconds per operation and per learner step (add + sample + update)."""
    if result.get("schema") != SCHEMA:
        raise ValueError(f"not a {SCHEMA} result")
    versions = ", ".join(f"{k} {v}" for k, v in result["versions"].items() if v)
    lines = [
        f"Measured {result['date']} on {result['machine']} (load {result['load']:.1f}), "
        f"{versions}; `python -m benchmarks.replay_libs run`. Median µs per operation over "
        f"{result['rounds']} rounds on a full replay: add {result['add']} sequences at the "
        f"maximum priority, sample {result['batch']} with importance weights, write their "
        "priorities back.",
        "",
        "| preset size | implementation | add µs | sample µs | update µs | step µs |",
        "|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        size = f"{row['preset']} ({row['capacity']:,} sequences)"
        if "error" in row:
            lines.append(f"| {size} | {row['impl']} | failed: {row['error']} | | | |")
            continue
        cells = [_num(row[f"{op}_us"], "{:,.1f}") for op in ("add", "sample", "update", "step")]
        lines.append(f"| {size} | {row.get('library', row['impl'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def table(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    result = json.loads(Path(args.json).read_text())
    write_block(markdown(result), args.update, parser, BEGIN, END)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.replay_libs",
                                     description=__doc__.splitlines()[0])  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="time every implementation, write the JSON")
    p_run.add_argument("--out", default=str(DEFAULT_OUT))
    p_run.add_argument("--venv-root", default=str(venvs.DEFAULT_ROOT))
    p_run.add_argument("--batch", type=int, default=64, help="sequences a learner step samples")
    p_run.add_argument("--add", type=int, default=16, help="sequences put between two steps")
    p_run.add_argument("--rounds", type=int, default=2000)
    p_table = sub.add_parser("table", help="render the JSON as Markdown")
    p_table.add_argument("json")
    p_table.add_argument("--update", metavar="PAGE")
    args = parser.parse_args(argv)
    if args.command == "run":
        return run(args)
    return table(args, parser)


if __name__ == "__main__":
    raise SystemExit(main())
