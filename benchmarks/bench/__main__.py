"""``make bench``: the system measured against its own limits, side by side.

For every point of a sweep of N actor processes x K envs per actor, four modes run back
to back (so their ratios hold on a noisy, shared machine):

- ``ideal``: the same N*K envs and the same model stepped in ONE process, no network
  (vector env step -> batched forward -> sample), the limit of the machine;
- ``echo``: the real actor processes against ``benchmarks.echo`` (answers without a
  model), the transport limit of the topology;
- ``inference``: the real learner with ``--no-train``;
- ``system``: the real learner, training.

The N actor processes are started once per point, by one ``python -m actors`` launcher
(so they are forked or exec'd as a user's would be), and stay up while the servers behind
the address change (they reconnect with a short backoff), so all three networked modes
measure the very same actors. Throughput, batch sizes, waits and learner RSS come from
the server's ``metrics.jsonl`` over a measuring window that starts after a warm-up once
all N actors are connected; step latency comes from the actors themselves
(their ``--stats-dir`` records, see :mod:`actors.roundtrip`); CPU and actor RSS from
``/proc``. After the sweep, focus rounds (:func:`focus_plan`) measure again what the
targets read, each pair back to back: the best point beside a fresh one-process ideal,
and 64x1 and 256x1 against echo. The table is printed and everything is written to
``bench.json``, with pass/fail columns against the speed targets (targets live here,
never in tests).

``python -m benchmarks.bench ideal --envs E --seconds S`` is the ideal worker (JSON on stdout).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.bench.measure import Settings, measure_reference, run_ideal, run_point
from benchmarks.bench.plan import (
    DEFAULT_FOCUS_REPEATS,
    DEFAULT_SWEEP,
    IDEAL_REFERENCE_ENVS,
    MODES,
    QUICK_SWEEP,
    SCHEMA,
    Point,
    focus_plan,
    parse_sweep,
)
from benchmarks.bench.report import (
    device_info,
    machine_info,
    preset_env,
    print_report,
    summarize,
    sweep_best_point,
)
from seedrl.config import PIN_CPUS_MODES, ActorConfig


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    sweep = args.sweep or (QUICK_SWEEP if args.quick else DEFAULT_SWEEP)
    warmup = args.warmup_s if args.warmup_s is not None else (0.5 if args.quick else 1.5)
    measure = args.measure_s if args.measure_s is not None else (1.5 if args.quick else 3.0)
    workdir = Path(tempfile.mkdtemp(prefix="seedrl-bench-"))
    settings = Settings(
        env=args.env,
        warmup_s=warmup,
        measure_s=measure,
        connect_timeout_s=args.connect_timeout_s,
        transport=args.transport,
        learner_args=tuple(args.learner_args.split()),
        actor_args=tuple(args.actor_args.split()),
        torch_threads=args.torch_threads,
        workdir=workdir,
        env_groups=args.env_groups,
        pin_cpus=args.pin_cpus,
        preset=args.preset,
        device=args.device,
    )
    started = time.time()
    load_before = os.getloadavg()

    def log(point: Point, mode: str, row: dict[str, Any]) -> None:
        if args.verbose:
            shown = row.get("error") or (
                f"{row.get('fps', 0):,.0f} frames/s, "
                f"{row.get('cpu_us_per_frame') or 0:.0f} cpu µs/frame"
            )
            elapsed = time.time() - started
            print(f"  [{elapsed:5.0f} s] {point.label:>10} {mode:<9} {shown}", file=sys.stderr,
                  flush=True)  # fmt: skip

    rows: list[dict[str, Any]] = []
    references: list[float | None] = []  # one per repeat (None: not measured)
    try:
        for repeat in range(args.repeats):
            references.append(measure_reference(settings) if "ideal" in args.modes else None)
            for point in sweep:
                rows += run_point(point, args.modes, repeat, settings, log)
        best = sweep_best_point(rows)
        plan = focus_plan(sweep, args.modes, best)
        judges_best = "ideal" in args.modes and any(
            point == best and "system" in modes for point, modes in plan
        )
        rounds = args.focus_repeats if plan else 0
        for repeat in range(args.repeats, args.repeats + rounds):
            # The one-process limit, measured right before the best point it judges.
            references.append(measure_reference(settings) if judges_best else None)
            for point, modes in plan:
                focus_rows = run_point(point, modes, repeat, settings, log)
                rows += ({**row, "focus": True} for row in focus_rows)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    measured = [x for x in references if x is not None]
    reference = statistics.median(measured) if measured else None
    table, targets = summarize(rows, reference, references, settings.env)
    return {
        "schema": SCHEMA,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "wall_time_s": time.time() - started,
        "machine": {**machine_info(), "device": device_info(args.device)},
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "settings": {
            "env": settings.env,
            "sweep": [point.label for point in sweep],
            "modes": list(args.modes),
            "repeats": args.repeats,
            "focus_repeats": args.focus_repeats,
            "warmup_s": warmup,
            "measure_s": measure,
            "transport": settings.transport,
            "torch_threads": settings.torch_threads,
            "env_groups": settings.env_groups,
            "pin_cpus": settings.pin_cpus,
            "preset": settings.preset,
            "device": settings.device,
            "learner_args": list(settings.learner_args),
            "actor_args": list(settings.actor_args),
        },
        "ideal_reference": {"envs": IDEAL_REFERENCE_ENVS, "fps": reference, "runs": measured},
        "results": rows,
        "points": table,
        "targets": targets,
    }


def ideal_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench ideal")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--envs", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--warmup-s", type=float, default=1.0)
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--preset")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--learner-args", default="", help="the learner's flags, one string")
    parser.add_argument("--train", action="store_true", help="train on each batch in line")
    a = parser.parse_args(argv)
    result = run_ideal(
        a.env, a.envs, a.seconds, a.warmup_s, a.torch_threads, a.preset, a.device,
        a.learner_args.split(), a.train,
    )  # fmt: skip
    print(json.dumps(result))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["ideal"]:
        return ideal_main(args_list[1:])
    parser = argparse.ArgumentParser(
        prog="python -m learner bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="CI smoke: 2 small points, short")
    parser.add_argument("--sweep", type=parse_sweep, help="points N x K, e.g. 1x1,64x1,256x1")
    parser.add_argument("--modes", type=lambda t: tuple(t.split(",")), default=MODES,
                        help="comma list of ideal,echo,inference,system")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=1, help="sweeps, interleaved; medians")
    parser.add_argument(
        "--focus-repeats",
        type=int,
        help="rounds after the sweep that measure again, back to back, 64x1 and 256x1 (echo, "
        "system) and the best point beside a one-process ideal (default 2; 0 with --quick)",
    )
    parser.add_argument("--warmup-s", type=float, help="after all actors connect (default 1.5)")
    parser.add_argument("--measure-s", type=float, help="measuring window per mode (default 3)")
    parser.add_argument("--connect-timeout-s", type=float, default=120.0)
    parser.add_argument(
        "--transport",
        choices=("auto", "tcp", "unix"),
        default="auto",
        help="auto: actors dial 127.0.0.1 and use the same-host unix socket the servers "
        "offer (the default deployment); tcp: loopback TCP only; unix: bind a unix path",
    )
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument(
        "--env-groups", type=int, default=1, help="actor --env-groups G where G divides K"
    )
    parser.add_argument(
        "--pin-cpus",
        choices=PIN_CPUS_MODES,
        default=ActorConfig.pin_cpus,
        help="actors' CPUs as `python -m actors --pin-cpus` gives them (on: one each, "
        "round robin; auto: so when N is a multiple of the CPUs; default: %(default)s)",
    )
    parser.add_argument("--learner-args", default="", help="extra learner flags, one string")
    parser.add_argument("--actor-args", default="", help="extra actor flags, one string")
    parser.add_argument("--env", help="default: the preset's env, else CartPole-v1")
    parser.add_argument(
        "--preset", help="a learner preset (e.g. atari: ALE/Pong-v5 and its CNN) for every row"
    )
    parser.add_argument(
        "--device",
        default="auto",
        help="the learner's and the ideal's torch device (auto: CUDA when present)",
    )
    parser.add_argument("--out", default="bench.json")
    parser.add_argument("--verbose", "-v", action="store_true", help="a line per measurement")
    args = parser.parse_args(args_list)
    if args.focus_repeats is None:
        args.focus_repeats = 0 if args.quick else DEFAULT_FOCUS_REPEATS
    if args.env is None:
        args.env = preset_env(args.preset) if args.preset else "CartPole-v1"
    if args.repeats < 1 or args.focus_repeats < 0:
        parser.error("--repeats must be >= 1 and --focus-repeats >= 0")
    unknown = set(args.modes) - set(MODES)
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}; choose from {MODES}")
    report = run_bench(args)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print_report(report["points"], report["results"], report["targets"])
    device = report["machine"]["device"]
    gpu = f" ({device['gpu']})" if "gpu" in device else ""
    print(f"env {args.env}, device {device['name']}{gpu}")
    print(f"wrote {args.out} ({report['wall_time_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
