"""``python -m benchmarks.loadgen``: the learner's ceiling under synthetic actors.

``run`` (the default) measures; ``table FILE... [--update docs/performance.md]`` renders
result files as the page's load-generator block. See :mod:`benchmarks.loadgen`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from actors.placement import actor_process_sizes, usable_cpu_count
from benchmarks.bench.report import machine_info
from benchmarks.loadgen.measure import MODES, Settings, measure
from benchmarks.loadgen.summary import SCHEMA, summarize
from benchmarks.loadgen.table import render as render_table
from benchmarks.loadgen.table import update_doc

DEFAULT_OUT = "benchmarks/results/loadgen.json"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.loadgen",
        description="Synthetic actors on real streams against a real learner: its CPU per "
        "frame (split by phase), frames/s answered and trained, round trips.",
    )
    p.add_argument("--env", default="CartPole-v1", help="the learner's --env")
    p.add_argument("--preset", default=None, help="the learner's --preset (e.g. atari)")
    p.add_argument(
        "--device", default="cpu",
        help="the learner's --device (cuda: the forward pass and training on the GPU)",
    )  # fmt: skip
    p.add_argument("--streams", type=int, default=64, help="S synthetic actor streams")
    p.add_argument("--envs", type=int, default=1, help="K envs per stream")
    p.add_argument(
        "--connections", type=int, default=0,
        help="gRPC connections the streams share (0: as many as the actor launcher would "
        "start processes for S actors on this host)",
    )  # fmt: skip
    p.add_argument(
        "--generators", type=int, default=1,
        help="generator processes the streams are split over (1: this process)",
    )  # fmt: skip
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated of {MODES}")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds of all modes")
    p.add_argument("--warmup-s", type=float, default=2.0)
    p.add_argument("--measure-s", type=float, default=4.0)
    p.add_argument("--connect-timeout-s", type=float, default=120.0)
    p.add_argument(
        "--transport", choices=("auto", "tcp"), default="auto",
        help="auto: the learner's same-host unix socket, as actors take it; tcp: loopback TCP",
    )  # fmt: skip
    p.add_argument("--tape-steps", type=int, default=1024, help="env steps recorded once")
    p.add_argument("--learner-args", default="", help="more learner flags, one string")
    p.add_argument(
        "--serving-processes", default="0",
        help="comma-separated learner --serving-processes values, interleaved in each round "
        "(a value N > 0 labels its rows MODE@N; echo runs only at 0)",
    )  # fmt: skip
    p.add_argument("--out", default=DEFAULT_OUT, help="the result JSON (schema seedrl-loadgen/1)")
    return p


def run(argv: Sequence[str]) -> int:
    args = _parser().parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(modes) - set(MODES))
    if unknown or not modes:
        print(f"python -m benchmarks.loadgen: error: unknown --modes {unknown}", file=sys.stderr)
        return 2
    if min(args.streams, args.envs, args.repeats) < 1 or args.measure_s <= 0:
        print(
            "python -m benchmarks.loadgen: error: --streams, --envs and --repeats must be "
            ">= 1 and --measure-s > 0",
            file=sys.stderr,
        )
        return 2
    if not 1 <= args.generators <= args.streams:
        print(
            "python -m benchmarks.loadgen: error: --generators must be between 1 and "
            f"--streams ({args.streams}), not {args.generators}",
            file=sys.stderr,
        )
        return 2
    try:
        tiers = [int(n) for n in args.serving_processes.split(",") if n]
    except ValueError:
        tiers = []
    if not tiers or min(tiers) < 0:
        print(
            "python -m benchmarks.loadgen: error: --serving-processes takes counts >= 0, "
            f"comma-separated, not {args.serving_processes!r}",
            file=sys.stderr,
        )
        return 2
    connections = args.connections or len(actor_process_sizes(args.streams, 0, usable_cpu_count()))
    # SIGTERM unwinds like Ctrl-C, so the server and streams of the window are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    began, load_before = time.time(), os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="seedrl-loadgen-") as workdir:
        settings = Settings(
            env=args.env, streams=args.streams, envs=args.envs, connections=connections,
            warmup_s=args.warmup_s, measure_s=args.measure_s,
            connect_timeout_s=args.connect_timeout_s, transport=args.transport,
            learner_args=tuple(shlex.split(args.learner_args)), tape_steps=args.tape_steps,
            workdir=Path(workdir), preset=args.preset, device=args.device,
            generators=args.generators,
        )  # fmt: skip
        rows = _measure_all(settings, modes, args.repeats, tiers)
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(began)),
        "wall_time_s": time.time() - began,
        "machine": machine_info(),
        "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
        "settings": _settings_record(args, modes, connections),
        "results": rows,
    }
    result.update(summarize(rows, args.env, args.envs))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(render_table([result]))
    print(f"wrote {out}")
    failed = [r for r in rows if r.get("error")]
    return 1 if failed and len(failed) == len(rows) else 0


def _settings_record(
    args: argparse.Namespace, modes: list[str], connections: int
) -> dict[str, Any]:
    return {
        "env": args.env, "preset": args.preset, "streams": args.streams, "envs": args.envs,
        "connections": connections, "modes": modes, "repeats": args.repeats,
        "warmup_s": args.warmup_s, "measure_s": args.measure_s, "transport": args.transport,
        "learner_args": args.learner_args, "tape_steps": args.tape_steps,
        "device": args.device, "serving_processes": args.serving_processes,
        "generators": args.generators,
    }  # fmt: skip


def _measure_all(
    settings: Settings, modes: list[str], repeats: int, tiers: Sequence[int] = (0,)
) -> list[dict[str, Any]]:
    """Every mode at every --serving-processes value, interleaved in each round."""
    tapes: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    for repeat in range(repeats):
        for mode in modes:
            for tier in tiers:
                if tier and mode == "echo":  # the echo server has no model to serve for
                    continue
                run = settings
                if mode != "echo":  # 0 said too: the learner's default depends on the host
                    extra = ("--serving-processes", str(tier))
                    run = replace(settings, learner_args=(*settings.learner_args, *extra))
                label = f"{mode}@{tier}" if tier else mode
                base = {"mode": label, "repeat": repeat, "serving_processes": tier}
                try:
                    row = {**base, **measure(mode, run, tapes)}
                except RuntimeError as exc:
                    row = {**base, "error": str(exc)}
                rows.append(row)
                print(_progress_line(row), flush=True)
    return rows


def _progress_line(row: dict[str, Any]) -> str:
    if row.get("error"):
        return f"{row['mode']:>9} #{row['repeat']}: error: {row['error'][:300]}"
    trained = row.get("trained_fps")
    return (
        f"{row['mode']:>9} #{row['repeat']}: learner {row['learner_cpu_us_per_frame']:.1f} "
        f"µs/frame, {row['fps_answered']:,.0f} frames/s answered"
        + (f", {trained:,.0f} trained" if trained else "")
        + f", rtt p50 {row['rtt_p50_ms']:.2f} ms"
        + (
            f", frontends {' + '.join(f'{c:.1f}' for c in row['frontend_cpu_us_per_frame_each'])}"
            " µs/frame"
            if row.get("frontend_cpu_us_per_frame_each")
            else ""
        )
    )


def table(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.loadgen table")
    p.add_argument("files", nargs="+", help="loadgen result JSONs, one table row group each")
    p.add_argument("--update", default=None, help="write between the page's loadgen markers")
    args = p.parse_args(argv)
    results = [json.loads(Path(f).read_text()) for f in args.files]
    block = render_table(results)
    if args.update:
        update_doc(Path(args.update), block)
    else:
        print(block)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "table":
        return table(argv[1:])
    if argv and argv[0] == "run":
        argv = argv[1:]
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
