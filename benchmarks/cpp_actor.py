"""``python -m benchmarks.cpp_actor``: the C++ reference actor beside the Python actor, in one
run on one machine.

    python -m benchmarks.cpp_actor run [--out benchmarks/results/cpp-actor.json]
    python -m benchmarks.cpp_actor table JSON [--update docs/performance.md]

``run`` starts each server once (``echo``: the learner's own Act handler answering zero
actions, the transport limit; ``system``: ``python -m learner`` training) and, behind it,
one actor at a time: Python then C++, K = 1 then 32 envs, interleaved over the repeats so
both see the same machine. Each measurement waits for the actor's stream, warms up, then
reads frames/s from the server's ``metrics.jsonl`` and the actor's and server's CPU from
``/proc`` over a window. Both actors stream over loopback TCP (the C++ actor does not take
the learner's unix socket). ``table`` renders the JSON as docs/performance.md's block
between ``<!-- cpp-actor-results:begin -->`` and ``<!-- cpp-actor-results:end -->``; it
reads only the JSON, so an old run renders with today's code.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.bench.fleet import stop_process, wait_for
from benchmarks.bench.procfs import cpu_seconds, shared_aware_mb, split_cpu_seconds
from benchmarks.bench.report import machine_info
from benchmarks.results_table import _num, write_block
from seedrl.metrics import read_metrics
from seedrl.timing import process_rss_mb
from seedrl.transport import free_port

REPO = Path(__file__).resolve().parents[1]
SCHEMA = "seedrl-cpp-actor/1"
BEGIN = "<!-- cpp-actor-results:begin -->"
END = "<!-- cpp-actor-results:end -->"
DEFAULT_OUT = "benchmarks/results/cpp-actor.json"
DEFAULT_BINARY = "actors/cpp/build/seedrl-actor"
ACTORS = ("python", "cpp")
MODES = ("echo", "system")
CONNECT_TIMEOUT_S = 120.0


def actor_command(kind: str, binary: str, address: str, k: int) -> list[str]:
    if kind == "cpp":
        return [binary, "--learner", address, "--envs-per-actor", str(k), "--max-backoff-s", "0.3"]
    return [sys.executable, "-m", "actors", "actor", "--learner", address,
            "--envs-per-actor", str(k), "--max-backoff-s", "0.3"]  # fmt: skip


def server_command(mode: str, port: int, logdir: Path) -> list[str]:
    common = ["--env", "CartPole-v1", "--port", str(port), "--logdir", str(logdir),
              "--log-interval-s", "0.5", "--no-local-socket"]  # fmt: skip
    if mode == "echo":
        return [sys.executable, "-m", "benchmarks.echo", *common]
    return [sys.executable, "-m", "learner", *common, "--progress", "off", "--no-tensorboard",
            "--checkpoint-interval-s", "1e9"]  # fmt: skip


def _frames(logdir: Path) -> tuple[float, float, int]:
    """(elapsed_s, frames, actors connected) of the server's newest metrics record."""
    records = read_metrics(logdir)
    if not records:
        return 0.0, 0.0, 0
    last = records[-1]
    return float(last["elapsed_s"]), float(last["frames"]), int(last.get("actors_connected", 0))


def measure(
    kind: str, k: int, mode: str, server: subprocess.Popen[bytes], logdir: Path, port: int,
    args: argparse.Namespace,
) -> dict[str, Any]:  # fmt: skip
    """One actor against the running server: its row of numbers."""
    actor = subprocess.Popen(
        actor_command(kind, args.binary, f"127.0.0.1:{port}", k),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO,
    )  # fmt: skip
    try:
        connected = wait_for(lambda: _frames(logdir)[2] >= 1, CONNECT_TIMEOUT_S, 0.1)
        if not connected or actor.poll() is not None:
            return {"error": f"{kind} actor did not connect (exit {actor.poll()})"}
        time.sleep(args.warmup_s)
        t0, frames0 = _frames(logdir)[:2]
        cpu0, server0 = cpu_seconds(actor.pid), split_cpu_seconds(server.pid)
        started = time.monotonic()
        time.sleep(args.measure_s)
        wait_for(lambda: _frames(logdir)[0] > t0 + args.measure_s, args.measure_s, 0.1)
        wall = time.monotonic() - started
        t1, frames1 = _frames(logdir)[:2]
        cpu1, server1 = cpu_seconds(actor.pid), split_cpu_seconds(server.pid)
        rss = process_rss_mb(actor.pid)
        uss_pss = shared_aware_mb(actor.pid)
    finally:
        stop_process(actor)
    wait_for(lambda: _frames(logdir)[2] == 0, 10.0, 0.1)  # the next actor measures alone
    fps = (frames1 - frames0) / max(t1 - t0, 1e-9)
    per_frame = 1e6 / max(fps, 1e-9)
    actor_cpu = (cpu1 - cpu0) / wall
    return {
        "fps": fps,
        "round_trips_per_s": fps / k,
        "actor_cpu": actor_cpu,
        "actor_cpu_us_per_frame": actor_cpu * per_frame,
        "server_cpu_us_per_frame": (sum(server1) - sum(server0)) / wall * per_frame,
        "actor_rss_mb": rss or None,
        "actor_pss_mb": uss_pss[1] if uss_pss else None,
        "window_s": t1 - t0,
    }


def cpp_versions() -> dict[str, str]:
    found = {}
    for lib in ("grpc++", "protobuf"):  # the C++ libraries the actor was built against
        done = subprocess.run(["pkg-config", "--modversion", lib], capture_output=True, text=True)
        if done.returncode == 0:
            found[f"lib{lib}"] = done.stdout.strip()
    return found


def run(args: argparse.Namespace) -> int:
    binary = Path(args.binary)
    if not binary.is_file():
        sys.stderr.write(f"no C++ actor at {binary}: run make actors-cpp first\n")
        return 2
    ks = [int(k) for k in args.envs.split(",")]
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {**machine_info(), "cpp": cpp_versions()},
        "settings": {"envs": ks, "modes": list(args.modes.split(",")), "repeats": args.repeats,
                     "warmup_s": args.warmup_s, "measure_s": args.measure_s},
        "results": [],
    }  # fmt: skip
    doc["load_average"] = {"before": list(os.getloadavg())}
    started = time.monotonic()
    workdir = Path(args.workdir)
    for mode in args.modes.split(","):
        port = free_port()
        logdir = workdir / f"{mode}-{time.monotonic_ns()}"
        logdir.mkdir(parents=True)
        with open(logdir.with_suffix(".log"), "wb") as log:
            server = subprocess.Popen(server_command(mode, port, logdir), stdout=log,
                                      stderr=subprocess.STDOUT, cwd=REPO)  # fmt: skip
            try:
                for repeat in range(args.repeats):
                    for k in ks:
                        for kind in ACTORS:
                            row = measure(kind, k, mode, server, logdir, port, args)
                            doc["results"].append(
                                {"actor": kind, "k": k, "mode": mode, "repeat": repeat, **row}
                            )
                            print(f"{mode} {kind} K={k} #{repeat}: {summary(row)}", flush=True)
            finally:
                stop_process(server)
    doc["wall_time_s"] = time.monotonic() - started
    doc["load_average"]["after"] = list(os.getloadavg())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"wrote {out} ({doc['wall_time_s'] / 60:.1f} min)")
    return 0


def summary(row: dict[str, Any]) -> str:
    if "error" in row:
        return f"failed: {row['error']}"
    return f"{row['fps']:,.0f} frames/s, actor {row['actor_cpu_us_per_frame']:.1f} CPU µs/frame"


# ---------------------------------------------------------------------- the table

COLUMNS = ("mode", "K", "actor", "frames/s", "C++ / Python", "round trips/s",
           "actor CPU µs/frame", "actor cores", "server CPU µs/frame", "actor RSS MB",
           "actor PSS MB")  # fmt: skip
NAMES = {"python": "Python", "cpp": "C++"}


def medians(rows: list[dict[str, Any]]) -> dict[tuple[str, int, str], dict[str, float]]:
    """(mode, K, actor) -> the median of each number over the repeats that measured."""
    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for row in rows:
        if "error" not in row:
            groups.setdefault((row["mode"], row["k"], row["actor"]), []).append(row)
    out = {}
    for key, group in groups.items():
        numbers = {k for row in group for k, v in row.items() if isinstance(v, int | float)}
        out[key] = {
            name: statistics.median(r[name] for r in group if r.get(name) is not None)
            for name in numbers
            if any(r.get(name) is not None for r in group)
        }
    return out


def _load(doc: dict[str, Any]) -> str:
    """ ", load average A before and B after" (1-minute), when the run recorded it."""
    load = doc.get("load_average") or {}
    if "before" not in load or "after" not in load:
        return ""
    return f", load average {load['before'][0]:.1f} before and {load['after'][0]:.1f} after"


def render(doc: dict[str, Any]) -> str:
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"not a {SCHEMA} report (schema {doc.get('schema')!r})")
    m, s = doc.get("machine", {}), doc.get("settings", {})
    versions = ", ".join(f"{k} {v}" for k, v in sorted({**m.get("versions", {}),
                                                        **m.get("cpp", {})}.items()))  # fmt: skip
    lines = [
        f"Measured {doc.get('date', '?')} on {m.get('cpu_model') or 'an unknown CPU'} "
        f"({m.get('cpus', '?')} CPUs, {m.get('platform', '?')}), Python {m.get('python', '?')}"
        + (f", {versions}" if versions else "")
        + ".",
        f"`make bench-cpp-actor`: one actor at a time, {s.get('repeats', '?')} repeat(s), "
        f"windows of {s.get('measure_s', '?')} s after {s.get('warmup_s', '?')} s of warm-up; "
        f"{doc.get('wall_time_s', 0) / 60:.1f} min{_load(doc)}. Numbers are medians over the "
        "repeats.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    med = medians(doc.get("results", []))
    errors = [r for r in doc.get("results", []) if "error" in r]
    for mode in s.get("modes", MODES):
        for k in s.get("envs", []):
            python = med.get((mode, k, "python"), {})
            for kind in ACTORS:
                row = med.get((mode, k, kind))
                if row is None:
                    continue
                ratio = row["fps"] / python["fps"] if kind == "cpp" and python.get("fps") else None
                cells = [
                    mode, str(k), NAMES[kind], _num(row.get("fps")), _num(ratio, "{:.2f}"),
                    _num(row.get("round_trips_per_s")),
                    _num(row.get("actor_cpu_us_per_frame"), "{:.1f}"),
                    _num(row.get("actor_cpu"), "{:.2f}"),
                    _num(row.get("server_cpu_us_per_frame"), "{:.1f}"),
                    _num(row.get("actor_rss_mb"), "{:.0f}"),
                    _num(row.get("actor_pss_mb"), "{:.0f}"),
                ]  # fmt: skip
                lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "echo: the learner's Act handler answering zero actions (no model), so frames/s is "
        "what one actor and the transport sustain; system: `python -m learner` training. "
        "Actor CPU µs/frame: the actor process's CPU time per env step, the cost that decides "
        "how many actors a host runs; actor cores: its CPU use while measured.",
    ]
    if errors:
        failed = "; ".join(f"{e['mode']} {e['actor']} K={e['k']}: {e['error']}" for e in errors)
        lines += ["", f"{len(errors)} measurement(s) failed: {failed}"]
    return "\n".join(lines) + "\n"


def table(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    doc = json.loads(Path(args.json).read_text())
    try:
        block = render(doc)
    except ValueError as exc:
        parser.error(str(exc))
    write_block(block, args.update, parser, BEGIN, END)
    return 0


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cpp_actor", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="measure both actors, write the JSON")
    r.add_argument("--out", default=DEFAULT_OUT)
    r.add_argument("--binary", default=DEFAULT_BINARY, help="the built C++ actor")
    r.add_argument("--envs", default="1,32", help="K values, comma-separated")
    r.add_argument("--modes", default=",".join(MODES), help="echo,system")
    r.add_argument("--repeats", type=int, default=2)
    r.add_argument("--warmup-s", type=_positive, default=2.0)
    r.add_argument("--measure-s", type=_positive, default=5.0)
    r.add_argument("--workdir", default="runs/bench-cpp-actor")
    t = sub.add_parser("table", help="render the JSON as docs/performance.md's block")
    t.add_argument("json")
    t.add_argument("--update", metavar="PAGE", help="replace the block in this Markdown page")
    args = parser.parse_args(argv)
    if args.command == "run":
        bad = set(args.modes.split(",")) - set(MODES)
        if bad:
            parser.error(f"--modes: unknown {', '.join(sorted(bad))} (echo, system)")
        return run(args)
    return table(args, parser)


if __name__ == "__main__":
    sys.exit(main())
