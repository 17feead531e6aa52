"""seedrl itself, measured like the peers: CartPole-v1 with ``make demo``'s settings until
the mean of the last 100 training episodes reaches the target, Atari Pong with
``--preset atari`` for a fixed wall time, a structured-suite env with the learner's
defaults (no preset) for a fixed wall time, and SAC on a robot (``--preset mujoco-sac``)
for a fixed window after its first update.

Runs in seedrl's own environment as ``python -m benchmarks.peers.seedrl_driver
cartpole|atari`` through ``learner.train`` (the learner in this process, the actor
launcher as a child, as ``make demo`` runs them), then reads the run's ``metrics.jsonl``:
the learner writes a record every log interval, and the first one whose 100-episode
mean reached the target is where CartPole was solved.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from benchmarks.peers.measure import (
    WINDOW,
    curve_point,
    emit_result,
    say,
    steady_rate,
    task_driver_parser,
    update_rates,
)

DEMO = {"preset": "cartpole", "num_actors": 2, "envs_per_actor": 32}
"""What ``python -m learner demo`` starts."""
ATARI = {"env": "ALE/Pong-v5", "preset": "atari", "num_actors": 2, "envs_per_actor": 16}
SAC: dict[str, Any] = {"preset": "mujoco-sac", "num_actors": 2, "envs_per_actor": 8}
"""``make learner ARGS="--preset mujoco-sac"`` + ``make actors N=2`` (the preset's envs each)."""
SUMMARY = {
    "cartpole": f"{DEMO['num_actors']} actors × {DEMO['envs_per_actor']} envs, make demo",
    "atari": f"{ATARI['num_actors']} actors × {ATARI['envs_per_actor']} envs, --preset atari",
    "structured": "{num_actors} actors × {envs_per_actor} envs, the learner's defaults",
    "sac": "{num_actors} actors × {envs_per_actor} envs, --preset mujoco-sac",
}
REPORT_EVERY_S = 5.0
POLL_S = 1.0
"""How often the metrics are read (the learner writes them every 2 s)."""


def first_solved(records: Sequence[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """The first metrics record whose mean over the last 100 episodes reached ``target``
    (with at least 100 episodes finished, as the learner's own stop rule asks)."""
    for record in records:
        mean = record.get("episode_return_mean")
        if mean is not None and record.get("episodes", 0) >= WINDOW and mean >= target:
            return record
    return None


Sample = TypeVar("Sample", bound=tuple[float, ...])


def measured_span(samples: list[Sample], stop_at: float | None) -> list[Sample]:
    """The samples taken while the learner ran: up to the one the stop was asked at, or,
    when it stopped by itself, all but the record it writes once stopped."""
    if stop_at is None:
        return samples[:-1]
    return [s for s in samples if s[0] <= stop_at]


def stopped_by(reason: str, solved: bool) -> str:
    """The learner's stop reason in the words the other drivers use."""
    if solved:
        return "target"
    if reason.startswith("signal"):
        return "measured"  # this driver's own stop once the window was measured
    if reason.endswith(" frames"):
        return "frame cap"
    if reason.endswith(" s"):
        return "wall cap"
    return reason


def frame_samples(records: Sequence[dict[str, Any]]) -> list[tuple[float, float]]:
    """``(elapsed s, frames)`` from the first record with frames on: the time before the
    actors' first frames is start-up, as a peer's time before its first training step."""
    samples = [(float(r["elapsed_s"]), float(r["frames"])) for r in records if "frames" in r]
    first = next((i for i, (_, frames) in enumerate(samples) if frames > 0), len(samples))
    return samples[max(0, first - 1) :] if first < len(samples) else []


def update_samples(records: Sequence[dict[str, Any]]) -> list[tuple[float, float, float]]:
    """``(elapsed s, frames, learner steps)`` from the record before the first update on:
    filling the replay before it is start-up, as the single-process loop's first
    ``learning_starts`` steps are."""
    samples = [(float(r["elapsed_s"]), float(r["frames"]), float(r["learner_steps"]))
               for r in records if "frames" in r and "learner_steps" in r]  # fmt: skip
    first = next((i for i, s in enumerate(samples) if s[2] > 0), len(samples))
    return samples[max(0, first - 1) :] if first < len(samples) else []


def return_curve(
    records: Sequence[dict[str, Any]], launch_offset_s: float
) -> list[list[float | None]]:
    """The run's mean-100 training return over time, one point per metrics record that
    has frames: seconds from launch (a record's wall clock plus ``launch_offset_s``)."""
    return [
        curve_point(float(r["time"]) + launch_offset_s, int(r["frames"]),
                    r.get("episode_return_mean"))
        for r in records
        if "frames" in r and "time" in r
    ]  # fmt: skip


def _watch(
    logdir: Path, label: str, done: threading.Event, measure_s: float | None, stop: list[float]
) -> None:
    """Progress lines from the run's metrics; with ``measure_s``, stop the learner (SIGINT,
    its clean stop) once that long has passed since its first frames, so actors that
    are slow to start do not shorten the measured window, and put the last measured
    record's time in ``stop`` (records written while it stops are not steady)."""
    from seedrl.metrics import read_metrics

    next_report = 0.0
    while not done.wait(POLL_S):
        try:
            records = read_metrics(logdir)
        except (OSError, ValueError):
            continue
        if not records:
            continue
        last = records[-1]
        samples = (update_samples if label == "sac" else frame_samples)(records)
        if measure_s and len(samples) > 1 and samples[-1][0] - samples[0][0] >= measure_s:
            stop.append(samples[-1][0])
            os.kill(os.getpid(), signal.SIGINT)
            return
        if time.monotonic() >= next_report:
            mean = last.get("episode_return_mean")
            say(f"seedrl {label}: {last['frames']:,} frames, mean return "
                f"{'-' if mean is None else f'{mean:.1f}'}, {last['elapsed_s']:.0f} s")  # fmt: skip
            next_report = time.monotonic() + REPORT_EVERY_S


def sac_batch_transitions() -> int:
    """Transitions in one SAC update of the preset: its batch of sequences times their length."""
    from seedrl.presets import load_preset

    preset = load_preset(SAC["preset"])
    return int(preset["batch_size"]) * int(preset["unroll_length"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = task_driver_parser(
        "python -m benchmarks.peers.seedrl_driver",
        "--logdir",
        frame_cap=20_000_000,
        tasks=("cartpole", "atari", "structured", "sac"),
    )
    parser.add_argument("--env", default="", help="structured and sac: the env id")
    parser.add_argument("--num-actors", type=int, default=2)
    parser.add_argument("--envs-per-actor", type=int, default=16)
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="FIELD=VALUE",
                        help="structured: a learner field changed from its default, to "
                        "measure a candidate default beside the peer")  # fmt: skip
    args = parser.parse_args(argv)
    if args.task in ("structured", "sac") and not args.env:
        parser.error(f"the {args.task} task needs --env")

    import learner
    from seedrl.metrics import read_metrics

    logdir = Path(args.logdir)
    if args.task == "cartpole":
        settings: dict[str, Any] = {"env": "CartPole-v1", **DEMO, "target_return": args.target}
        kwargs = {"target_return": args.target, "total_frames": args.frame_cap,
                  "max_seconds": args.wall_cap_s}  # fmt: skip
    elif args.task == "structured":  # no preset: what a user's own env starts from
        from benchmarks.learning.__main__ import parse_overrides

        settings = {"env": args.env, "preset": None, "num_actors": args.num_actors,
                    "envs_per_actor": args.envs_per_actor,
                    **parse_overrides(args.overrides)}  # fmt: skip
        # the same wall time from launch as the peer: what start-up took is not trained
        kwargs = {"max_seconds": max(1.0, args.wall_cap_s - (time.monotonic() - args.launched_at))}
    elif args.task == "sac":
        settings = {"env": args.env, **SAC}
        kwargs = {"max_seconds": args.wall_cap_s}
    else:
        settings = dict(ATARI)
        kwargs = {"max_seconds": args.wall_cap_s}
    settings["seed"] = args.seed
    done = threading.Event()
    measure = args.warmup_s + args.measure_s if args.task in ("atari", "sac") else None
    stop_at: list[float] = []
    reporter = threading.Thread(
        target=_watch, args=(logdir, args.task, done, measure, stop_at), daemon=True
    )
    reporter.start()
    called_mono, called_wall = time.monotonic(), time.time()
    try:
        result = learner.train(
            **{k: v for k, v in settings.items() if k != "target_return"},
            logdir=logdir,
            tensorboard=True,
            **kwargs,
        )
    finally:
        done.set()
    end = time.monotonic()
    records = read_metrics(logdir)
    samples = frame_samples(records)
    out: dict[str, Any] = {
        "startup_s": (called_mono - args.launched_at) + (samples[0][0] if samples else 0.0),
        "frames": result.frames,
        "wall_s": end - args.launched_at,
        "episodes": result.episodes,
        "return_mean100": result.episode_return_mean,
        "frame_skip": 4 if args.task == "atari" else 1,
        "stopped_by": stopped_by(result.reason, result.solved),
        "summary": SUMMARY[args.task].format(**settings)
        + "".join(f", {item}" for item in args.overrides),
        "settings": settings,
    }
    if args.task == "cartpole":
        solved = first_solved(records, args.target)
        # Records carry the wall clock; the pair taken before train() maps it onto the
        # monotonic clock of the launch time.
        to_target = (
            called_mono - args.launched_at + solved["time"] - called_wall if solved else None
        )
        out.update(
            reached=solved is not None,
            frames_to_target=solved["frames"] if solved else None,
            launch_to_target_s=to_target,
            train_to_target_s=to_target - out["startup_s"] if to_target is not None else None,
        )
    elif args.task == "structured":
        out["curve"] = return_curve(records, called_mono - args.launched_at - called_wall)
        if result.reason.startswith("signal"):  # no stop of its own here: the runner's
            out["stopped_by"] = "time limit"
    elif args.task == "sac":
        trained = measured_span(update_samples(records), stop_at[0] if stop_at else None)
        out.update(
            updates=int(records[-1].get("learner_steps", 0)) if records else 0,
            transitions_per_update=sac_batch_transitions(),
            startup_s=(called_mono - args.launched_at) + (trained[0][0] if trained else 0.0),
            **update_rates(trained, args.warmup_s),
        )
    else:
        steady = measured_span(samples, stop_at[0] if stop_at else None)
        out.update(
            agent_steps_per_s=steady_rate(steady, args.warmup_s),
            measured_s=max(0.0, steady[-1][0] - steady[0][0] - args.warmup_s) if steady else 0.0,
        )
    emit_result(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
