"""``python -m benchmarks.serving_tier``: the serving tier's candidate transport, measured.

``run`` (the default) sweeps observation kind x batch x doorbell through the slot table
(:mod:`benchmarks.serving_tier.slots`) and probes ``SO_REUSEPORT`` across ``grpc.aio``
servers (:mod:`benchmarks.serving_tier.reuseport`), writing one JSON; ``table FILE
[--update docs/serving-tier.md]`` renders it as the page's block, from the JSON alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.bench.report import machine_info
from benchmarks.doc_blocks import replace_block
from benchmarks.serving_tier.reuseport import probe
from benchmarks.serving_tier.run import run_once
from benchmarks.serving_tier.slots import BELLS, RunSpec, TableSpec

SCHEMA = "seedrl-serving-tier/1"
DEFAULT_OUT = "benchmarks/results/serving-tier.json"
BEGIN, END = "<!-- serving-tier:begin -->", "<!-- serving-tier:end -->"
OBS_KINDS = {
    "cartpole": ((4,), "float32", "mlp"),
    "atari": ((84, 84), "uint8", "pixels"),
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.serving_tier", description=__doc__)
    sub = p.add_subparsers(dest="command")
    run = sub.add_parser("run", help="measure (the default)")
    table = sub.add_parser("table", help="render a result file as the docs block")
    table.add_argument("file")
    table.add_argument("--update", default=None, help="a page with the block's markers")
    for q in (p, run):
        q.add_argument("--obs", default="cartpole,atari", help=f"of {sorted(OBS_KINDS)}")
        q.add_argument("--batches", default="64,1024", help="slots in flight = batch size")
        q.add_argument("--bells", default=",".join(BELLS), help=f"of {BELLS}")
        q.add_argument("--frontends", type=int, default=2)
        q.add_argument("--deadline-ms", type=float, default=2.0)
        q.add_argument("--warmup-s", type=float, default=0.5)
        q.add_argument("--measure-s", type=float, default=2.0)
        q.add_argument("--reuseport-servers", type=int, default=4)
        q.add_argument("--reuseport-clients", type=int, default=64)
        q.add_argument("--out", default=DEFAULT_OUT)
    return p


def measure(args: argparse.Namespace) -> dict[str, Any]:
    began = time.perf_counter()
    rows = []
    for kind in args.obs.split(","):
        shape, dtype, policy = OBS_KINDS[kind]
        for batch in (int(b) for b in args.batches.split(",")):
            for bell in args.bells.split(","):
                table = TableSpec(batch, shape, dtype, args.frontends)
                spec = RunSpec(table, bell, policy, quorum=batch, deadline_s=args.deadline_ms / 1e3)
                row = run_once(spec, args.warmup_s, args.measure_s)
                ok = row["served_S"] == row["requested_S"] and not row["errors"]
                del row["served_S"], row["requested_S"]
                rows.append({"obs": kind, **row, "consistent": ok})
                print(
                    f"{kind} B={batch} {bell}: model {row['model_cpu_us_per_frame']:.2f} µs/frame, "
                    f"{row['fps']:,.0f} frames/s, p50/p99 {row['rtt_p50_ms']:.2f}/"
                    f"{row['rtt_p99_ms']:.2f} ms",
                    file=sys.stderr,
                )
    reuse = probe(args.reuseport_servers, args.reuseport_clients)
    return {
        "schema": SCHEMA,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(),
        "settings": {
            k: getattr(args, k)
            for k in (
                "obs",
                "batches",
                "bells",
                "frontends",
                "deadline_ms",
                "warmup_s",
                "measure_s",
                "reuseport_servers",
                "reuseport_clients",
            )
        },
        "rows": rows,
        "reuseport": reuse,
        "wall_time_s": time.perf_counter() - began,
    }


def render(result: dict[str, Any]) -> str:
    m, s, r = result["machine"], result["settings"], result["reuseport"]
    lines = [
        f"Measured {result['date']} on {m.get('cpu_model') or 'unknown CPU'} ({m['cpus']} "
        f"CPUs), Python {m['python']}, numpy {m['versions'].get('numpy')}, grpcio "
        f"{m['versions'].get('grpcio')}. `python -m benchmarks.serving_tier --obs {s['obs']} "
        f"--batches {s['batches']} --frontends {s['frontends']}`: {s['frontends']} frontend "
        f"processes, one frame in flight per slot, batches close at all slots or "
        f"{s['deadline_ms']:g} ms, windows of {s['measure_s']:g} s; "
        f"{result['wall_time_s']:.0f} s.",
        "",
        "| obs | batch | doorbell | model CPU µs/frame | gather / forward / reply µs | "
        "beyond forward µs | frontend CPU µs/frame | frames/s | round trip p50/p99 ms | "
        "mean batch | consistent |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        ph = row["model_phases_us_per_frame"]
        lines.append(
            f"| {row['obs']} | {row['slots']} | {row['bell']} | "
            f"**{row['model_cpu_us_per_frame']:.2f}** | {ph['gather']:.2f} / "
            f"{ph['forward']:.2f} / {ph['reply']:.2f} | "
            f"{row['model_beyond_forward_us_per_frame']:.2f} | "
            f"{row['frontend_cpu_us_per_frame']:.1f} | {row['fps']:,.0f} | "
            f"{row['rtt_p50_ms']:.2f} / {row['rtt_p99_ms']:.2f} | {row['batch_mean']:.0f} | "
            f"{'yes' if row['consistent'] else 'NO'} |"
        )
    lines += [
        "",
        "Model CPU: the model process's CPU (`time.process_time`) over the frames it answered "
        "in the window, waking included; its phases on its thread's CPU clock; beyond forward: "
        "the model's CPU minus the forward pass. Frontend CPU: the frontends' CPU over the "
        "frames they took back (writing rows, reading actions, their doorbells; no gRPC). "
        "Consistent: every slot answered exactly as often as it asked, each with its own "
        "frame's action.",
        "",
        f"`SO_REUSEPORT`: {r['servers_bound']} of {r['servers']} `grpc.aio` server processes "
        f"bound one port with `grpc.so_reuseport` 1 (a bind with 0 was "
        f"{'refused' if r['reuseport0_bind_refused'] else 'ACCEPTED'}); {r['clients']} new "
        f"connections reached {r['servers_reached']} of them, "
        f"{' / '.join(str(n) for n in r['connections_per_server'])} each; with one server "
        f"killed, {r['clients']} new connections reached {r['after_kill_servers_reached']} "
        f"servers and {r['after_kill_failed_calls']} calls failed.",
    ]
    return "\n".join(lines) + "\n"


def update_doc(path: Path, block: str) -> None:
    replace_block(path, BEGIN, END, block)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "table":
        block = render(json.loads(Path(args.file).read_text()))
        if args.update:
            update_doc(Path(args.update), block)
        else:
            sys.stdout.write(block)
        return 0
    result = measure(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    sys.stdout.write(render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
