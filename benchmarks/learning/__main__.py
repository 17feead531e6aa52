"""``python -m benchmarks.learning``: train every env of a suite over several seeds to a
frame budget, then summarise, plot and tabulate the runs against published references.

    python -m benchmarks.learning run --suite minatar [--frames N] [--seeds N] [--envs A,B]
        [--first-seed S]
    python -m benchmarks.learning archive --out runs/bench-learning/minatar
    python -m benchmarks.learning table --out benchmarks/results/learning/minatar \
        --doc docs/learning.md

``run`` is resumable: finished runs (``run.json``) are kept, an interrupted one resumes
from its checkpoint, and a larger ``--frames`` extends finished runs. ``--stop-after``
interrupts it on time, so that a run longer than one lease of a host goes on over
several. The summary, the curves and ``table.md`` are rewritten after every run, so a
partial suite reports what it has. ``archive`` keeps the finished runs small enough to
commit, so that the tables in the docs regenerate from a clone and runs of several hosts
add up to one suite.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from benchmarks.learning import report
from benchmarks.learning.runner import INTERRUPTED, RANDOM_FILE, finished_run, random_return
from benchmarks.learning.suites import SUITES, EnvSpec, Suite

POLL_S = 10.0
"""How often the progress line is refreshed from the running learner's metrics."""
RANDOM_EPISODES = 20
RESULTS_DIR = "benchmarks/results/learning"
"""Where ``archive`` keeps runs for committing, one directory per suite; the tables in
docs/learning.md are generated from there."""
STOP_GRACE_S = 90.0
"""How long an interrupted run gets to checkpoint and stop before it is killed."""


def _last_record(logdir: Path) -> dict[str, Any] | None:
    path = logdir / "metrics.jsonl"
    if not path.exists():
        return None
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 8192))
        lines = [line for line in f.read().splitlines() if line.strip()]
    try:
        return dict(json.loads(lines[-1])) if lines else None
    except ValueError:
        return None  # a line being written


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def progress_line(label: str, record: dict[str, Any] | None, frames: int, started: float) -> str:
    elapsed = time.monotonic() - started
    if record is None:
        return f"{label}: starting ({_duration(elapsed)})"
    done = int(record["frames"])
    ret = record.get("episode_return_mean")
    fps = float(record.get("fps_mean") or 0.0)
    eta = f", eta {_duration((frames - done) / fps)}" if fps > 0 and done < frames else ""
    ret_text = "-" if ret is None else f"{ret:.2f}"
    return (
        f"{label}: {done / 1e6:.2f}/{frames / 1e6:.2f} M frames ({100 * done / frames:.0f} %), "
        f"return {ret_text}, {fps:,.0f} frames/s, {_duration(elapsed)}{eta}"
    )


def run_one(
    suite: Suite, spec: EnvSpec, seed: int, frames: int, logdir: Path, args: argparse.Namespace,
    label: str, shape: tuple[int, int],
) -> bool:  # fmt: skip
    """Train and evaluate one run (``shape``: actors, envs each) in a child process; True
    once it finished."""
    logdir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "benchmarks.learning.runner", "--suite", suite.name,
        "--env", spec.name, "--seed", str(seed), "--frames", str(frames),
        "--logdir", str(logdir), "--eval-episodes", str(args.eval_episodes),
        "--num-actors", str(shape[0]), "--envs-per-actor", str(shape[1]),
        "--overrides", json.dumps(args.overrides),
    ]  # fmt: skip
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    started = time.monotonic()
    with open(logdir / "run.log", "ab") as log:
        child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            while child.poll() is None and time.monotonic() < args.deadline:
                try:
                    child.wait(timeout=min(POLL_S, max(0.0, args.deadline - time.monotonic())))
                except subprocess.TimeoutExpired:
                    print(progress_line(label, _last_record(logdir), frames, started), flush=True)
        except KeyboardInterrupt:
            print(f"{label}: interrupted; checkpointing (rerun to resume)", flush=True)
            _stop(child)
            raise
        if child.poll() is None:
            print(f"{label}: --stop-after reached; checkpointing (rerun to resume)", flush=True)
            _stop(child)
    if child.returncode == INTERRUPTED:
        print(f"{label}: stopped by a signal before its budget; rerun to resume", flush=True)
        raise KeyboardInterrupt
    if child.returncode != 0:
        print(f"{label}: failed (exit {child.returncode}); see {logdir / 'run.log'}", flush=True)
        return False
    record = json.loads((logdir / "run.json").read_text())
    ev = record["eval"]
    final = record["train_return_mean100"]
    if ev is not None:
        score = f"evaluate {ev['mean']:.2f} +- {ev['std']:.2f} over {ev['episodes']} episodes"
    else:  # a two-player game: win rates per opponent and seat
        played = record["matches"]
        score = "; ".join(
            f"vs {m['opponent']} {report.seat_scores(played, m['opponent'], '{:.1f} %')}"
            for m in played
        )
    print(
        f"{label}: done in {_duration(time.monotonic() - started)}, "
        f"{record['frames']:,} frames, final mean-100 return "
        f"{'-' if final is None else f'{final:.2f}'}, {score}",
        flush=True,
    )
    return True


def _stop(child: subprocess.Popen[bytes]) -> None:
    """Stop a run as Ctrl-C does: it checkpoints on SIGINT; killed only if it hangs."""
    child.send_signal(signal.SIGINT)  # a terminal's Ctrl-C reached it already; kill didn't
    try:
        child.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def flag_error(message: str) -> NoReturn:
    """A bad flag value ends the command as argparse would: one line, exit status 2."""
    print(f"python -m benchmarks.learning: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def selected_envs(suite: Suite, names: str) -> list[EnvSpec]:
    if not names:
        return list(suite.envs)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    chosen = [s for s in suite.envs if any(w.lower() in s.name.lower() for w in wanted)]
    if not chosen:
        known = ", ".join(s.name for s in suite.envs)
        flag_error(f"--envs {names!r} matches none of {known}")
    return chosen


def run_plan(
    suite: Suite,
    specs: Sequence[EnvSpec],
    first_seed: int,
    seeds: int,
    shape: tuple[int, int] | None = None,
) -> list[tuple[EnvSpec, int, tuple[int, int]]]:
    """Every env with seeds ``first_seed`` onwards at each of its actor shapes (or at
    ``shape`` alone), env by env, seed by seed."""
    return [
        (spec, seed, each)
        for spec in specs
        for seed in range(first_seed, first_seed + seeds)
        for each in ((shape,) if shape else suite.shapes_of(spec))
    ]


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def cmd_run(args: argparse.Namespace) -> int:
    # Started in the background, SIGINT may arrive ignored; SIGTERM (a killed session)
    # stops the suite the same way: the running run checkpoints and resumes next time.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    suite = SUITES[args.suite]
    out = Path(args.out or f"runs/bench-learning/{suite.name}")
    args.eval_episodes = args.eval_episodes or suite.eval_episodes
    shape = None  # each env's own shapes, unless the command line names one
    if args.num_actors or args.envs_per_actor:
        shape = (args.num_actors or suite.num_actors, args.envs_per_actor or suite.envs_per_actor)
    # A host lent for less time than the suite needs: past the deadline the running run
    # checkpoints and the command exits as interrupted, to be resumed on the next host.
    args.deadline = time.monotonic() + args.stop_after if args.stop_after else float("inf")
    specs = selected_envs(suite, args.envs)
    plan = run_plan(suite, specs, args.first_seed, args.seeds, shape)
    failed = 0
    print(f"seedrl bench-learning: suite {suite.name}, {len(plan)} runs, results in {out}")
    for index, (spec, seed, run_shape) in enumerate(plan, 1):
        frames = args.frames or spec.frames
        logdir = out / spec.name / suite.run_name(seed, run_shape)
        label = f"[{index}/{len(plan)}] {spec.title} seed {seed}"
        if suite.shapes:
            label += f" at {run_shape[0]}x{run_shape[1]}"
        random_path = out / spec.name / RANDOM_FILE
        if not random_path.exists():
            random_path.parent.mkdir(parents=True, exist_ok=True)
            rnd = random_return(spec, RANDOM_EPISODES)
            if spec.random_level is not None:  # the exact level, the estimate kept beside it
                rnd = {**rnd, "mean": spec.random_level, "measured_mean": rnd["mean"]}
            random_path.write_text(json.dumps(rnd, indent=2) + "\n")
        if finished_run(logdir, frames) is not None:
            print(f"{label}: already finished, kept")
            continue
        if time.monotonic() >= args.deadline:
            print(f"{label}: --stop-after reached before it started; rerun to go on")
            report.write_summary(suite, out)
            return INTERRUPTED
        try:
            ok = run_one(suite, spec, seed, frames, logdir, args, label, run_shape)
        except KeyboardInterrupt:
            report.write_summary(suite, out)
            return INTERRUPTED
        failed += not ok
        summary = report.write_summary(suite, out)
        report.plot_curves(suite, out)
        report.write_whole(out / "table.md", report.markdown_table(summary, "curves"))
    summary = report.write_summary(suite, out)
    report.plot_curves(suite, out)
    report.write_whole(out / "table.md", report.markdown_table(summary, "curves"))
    print(f"summary: {out / report.SUMMARY_FILE}, table: {out / 'table.md'}, curves: {out}/curves")
    return 1 if failed else 0


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """``FIELD=VALUE`` pairs, each value read as the learner's ``--field`` flag reads it
    (``hidden_sizes=128,128`` a tuple, ``mirror=yes`` a boolean)."""
    import learner  # noqa: F401  (registers the agents, whose knobs are fields here too)
    from seedrl.cli import parse_field
    from seedrl.config import LearnerConfig, agent_sections, config_hints, knob_names

    fields = set(config_hints(LearnerConfig, {})).union(*map(knob_names, agent_sections().values()))
    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if key == "lambda":
            key = "lambda_"
        if not sep or key not in fields:
            raise ValueError(f"{item!r} is not FIELD=VALUE with a LearnerConfig field")
        overrides[key] = parse_field(LearnerConfig, key, text)
    return overrides


def suite_in(out: Path) -> Suite:
    """The suite whose results ``out`` holds, named by its summary."""
    path = out / report.SUMMARY_FILE
    if not path.exists():
        flag_error(f"--out {out}: no {report.SUMMARY_FILE} there; run the suite first")
    return report.suite_of(json.loads(path.read_text()))


def cmd_table(args: argparse.Namespace) -> int:
    """Rebuild summary and curves from the run directories; write the table into a doc."""
    out = Path(args.out)
    suite = suite_in(out)
    summary = report.write_summary(suite, out)
    doc = Path(args.doc) if args.doc else None
    home = doc.parent if doc else out  # the table's image links are relative to it
    default = home / "learning" / suite.curves_folder if doc else out / "curves"
    curves = Path(args.curves_dir) if args.curves_dir else default
    report.plot_curves(suite, out, curves)  # straight there: no copies beside the runs
    table = report.markdown_table(summary, os.path.relpath(curves, home))
    if doc:
        report.update_doc(doc, suite.name, table)
        print(f"{doc}: suite {suite.name} table updated, curves in {curves}")
    else:
        print(table, end="")
    return 0


def cmd_archive(args: argparse.Namespace) -> int:
    """Keep the finished runs' results (not their checkpoints) where they can be committed."""
    out = Path(args.out)
    suite = suite_in(out)
    results = Path(args.results or f"{RESULTS_DIR}/{suite.name}")
    try:
        copied = report.archive(suite, out, results)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for target in copied:
        print(f"archived {target}")
    print(f"{len(copied)} finished runs archived; summary: {results / report.SUMMARY_FILE}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.learning",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train and evaluate a suite (resumable)")
    run.add_argument("--suite", required=True, choices=sorted(SUITES))
    run.add_argument("--frames", type=int, default=0, help="frames per run (0: the suite's)")
    run.add_argument("--seeds", type=int, default=2, help="seeds per env (0, 1, ...)")
    run.add_argument("--first-seed", type=int, default=0,
                     help="the first seed, so that another host can run later ones")  # fmt: skip
    run.add_argument("--envs", default="", help="comma-separated subset of the suite's envs")
    run.add_argument("--out", default="", help="default: runs/bench-learning/SUITE")
    run.add_argument("--eval-episodes", type=int, default=0, help="0: the suite's")
    run.add_argument("--num-actors", type=int, default=0, help="0: the suite's")
    run.add_argument("--envs-per-actor", type=int, default=0, help="0: the suite's")
    run.add_argument("--stop-after", type=float, default=0.0, metavar="SECONDS",
                     help="end this command after SECONDS (0: never); the running run "
                     "checkpoints and resumes next time, exit status 130")  # fmt: skip
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                     help="a learner config field on top of the preset (repeatable); "
                     "use a separate --out, finished runs are not redone")  # fmt: skip
    table = sub.add_parser("table", help="summary, curves and markdown table of a suite's runs")
    table.add_argument("--out", required=True, help="the suite's results directory")
    table.add_argument("--doc", default="", help="write the table into this markdown file")
    table.add_argument(
        "--curves-dir",
        default="",
        help="where the PNGs go (default: learning/ beside DOC, else curves/ in OUT)",
    )
    keep = sub.add_parser(
        "archive", help="copy finished runs, thinned and without checkpoints, to be committed"
    )
    keep.add_argument("--out", required=True, help="the suite's results directory")
    keep.add_argument("--results", default="", help=f"default: {RESULTS_DIR}/SUITE")
    args = parser.parse_args(argv)
    if args.command == "run":
        try:
            args.overrides = parse_overrides(args.overrides)
        except ValueError as exc:
            parser.error(f"--set: {exc}")
        if args.seeds < 1:
            parser.error("--seeds must be >= 1")
        if args.first_seed < 0:
            parser.error("--first-seed must be >= 0")
        for name in ("frames", "eval_episodes", "num_actors", "envs_per_actor", "stop_after"):
            if getattr(args, name) < 0:
                parser.error(f"--{name.replace('_', '-')} must be >= 0")
    commands = {"run": cmd_run, "table": cmd_table, "archive": cmd_archive}
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
