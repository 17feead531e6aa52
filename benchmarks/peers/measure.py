"""What every peer is measured by, and how a driver reports it, in plain Python: the
drivers run inside the peers' own virtual environments and share this module with
seedrl's side, so all of them count the same way.

``ReturnWindow`` is seedrl's "solved" rule (``learner.run``): the mean of the last 100
finished training episodes, counted only once 100 have finished. ``steady_rate`` turns
``(seconds, frames)`` progress samples into a rate that leaves the start-up out.
``emit_result`` / ``parse_result`` carry a driver's one JSON result over its stdout.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any

WINDOW = 100
"""Episodes in the moving mean, as in seedrl's learner."""


class ReturnWindow:
    """The mean return of the last ``size`` episodes and whether it reached ``target``."""

    def __init__(self, target: float, size: int = WINDOW) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.target = target
        self.size = size
        self.episodes = 0
        self._returns: collections.deque[float] = collections.deque(maxlen=size)

    def add(self, returns: Iterable[float]) -> bool:
        """Record finished episodes in the order they ended; True once the target holds."""
        for value in returns:
            self._returns.append(float(value))
            self.episodes += 1
        return self.reached

    @property
    def mean(self) -> float | None:
        return sum(self._returns) / len(self._returns) if self._returns else None

    @property
    def reached(self) -> bool:
        mean = self.mean
        return len(self._returns) >= self.size and mean is not None and mean >= self.target


def steady_rate(samples: Sequence[tuple[float, float]], warmup_s: float) -> float | None:
    """Frames per second between the first sample at least ``warmup_s`` after the first
    one and the last sample; None when fewer than two samples lie in that window (the
    run was too short to say)."""
    if not samples:
        return None
    start = samples[0][0] + warmup_s
    window = [(t, frames) for t, frames in samples if t >= start]
    if len(window) < 2 or window[-1][0] <= window[0][0]:
        return None
    (t0, f0), (t1, f1) = window[0], window[-1]
    return (f1 - f0) / (t1 - t0)


def update_rates(samples: Sequence[tuple[float, float, float]], warmup_s: float) -> dict[str, Any]:
    """Env steps and updates per second over ``(seconds, steps, updates)`` samples taken
    from the first update on, leaving the first ``warmup_s`` out (None: too short)."""
    steps = steady_rate([(t, n) for t, n, _ in samples], warmup_s)
    updates = steady_rate([(t, u) for t, _, u in samples], warmup_s)
    measured = samples[-1][0] - samples[0][0] - warmup_s if samples else 0.0
    return {"env_steps_per_s": steps, "updates_per_s": updates, "measured_s": max(0.0, measured)}


def task_outcome(
    task: str,
    found: dict[str, Any],
    launched_at: float,
    started: float,
    samples: Sequence[tuple[float, float]],
    warmup_s: float,
) -> dict[str, Any]:
    """A driver's result fields for its task: CartPole's time and frames to the target
    (``found["reached_at"]``/``["frames"]`` when reached), else the steady rate."""
    if task == "cartpole":
        reached = "reached_at" in found
        return {
            "reached": reached,
            "frames_to_target": found.get("frames"),
            "launch_to_target_s": found["reached_at"] - launched_at if reached else None,
            "train_to_target_s": found["reached_at"] - started if reached else None,
        }
    return {
        "agent_steps_per_s": steady_rate(samples, warmup_s),
        "measured_s": max(0.0, samples[-1][0] - started - warmup_s) if samples else 0.0,
    }


PROGRESS_PREFIX = "peers-progress: "
"""Starts a progress line meant for the terminal (the rest of the output goes to the log)."""
RESULT_PREFIX = "peers-result: "
"""Starts the one stdout line that carries a driver's result (everything else is progress)."""


def emit_result(result: dict[str, Any]) -> None:
    """Print the driver's result line (flushed: the runner may stop the process next)."""
    print(RESULT_PREFIX + json.dumps(result, sort_keys=True), flush=True)


def parse_result(output: str) -> dict[str, Any] | None:
    """The last result line in a driver's output, or None when it printed none."""
    found = None
    for line in output.splitlines():
        if line.startswith(RESULT_PREFIX):
            try:
                found = json.loads(line[len(RESULT_PREFIX) :])
            except ValueError:
                continue
    return found if isinstance(found, dict) else None


def curve_point(seconds: float, frames: int, mean: float | None) -> list[float | None]:
    """One sample of a training curve: seconds from launch, frames, the mean-100 return."""
    return [round(seconds, 2), frames, None if mean is None else round(mean, 4)]


def say(message: str) -> None:
    """A progress line (flushed, so the runner shows it as it happens)."""
    # One write per line: a peer's worker processes share the pipe and would split it.
    sys.stdout.write(PROGRESS_PREFIX + message + "\n")
    sys.stdout.flush()


def driver_parser(prog: str) -> argparse.ArgumentParser:
    """The flags every driver takes from the runner (``__main__.driver_args`` writes them)."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--launched-at", type=float, required=True, help="time.monotonic()")
    parser.add_argument("--target", type=float, default=475.0)
    parser.add_argument("--wall-cap-s", type=float, required=True)
    parser.add_argument("--seed", type=int, default=0)
    return parser


def task_driver_parser(
    prog: str, run_dir_flag: str, frame_cap: int, tasks: Sequence[str] = ("cartpole", "atari")
) -> argparse.ArgumentParser:
    """:func:`driver_parser` plus what a driver of several tasks takes: the task, its run
    directory (under the peer's own flag name), the CartPole frame cap, the Atari window."""
    parser = driver_parser(prog)
    parser.add_argument("task", choices=tuple(tasks))
    parser.add_argument(run_dir_flag, required=True)
    parser.add_argument("--frame-cap", type=int, default=frame_cap)
    parser.add_argument("--measure-s", type=float, default=60.0)
    parser.add_argument("--warmup-s", type=float, default=20.0)
    return parser
