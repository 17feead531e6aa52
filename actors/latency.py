"""Actor-side round-trip statistics for benchmarks: step latency as the actor sees it.

The learner can count frames but cannot see how long an actor waits for its actions;
only the actor can. ``RoundTripStats`` keeps the last ``capacity`` round-trip times
(write frame -> actions read) in a preallocated ring buffer (two ``perf_counter`` calls
and one array store per frame: no per-frame allocation), and on ``flush`` appends one
JSON line per stream to ``$SEEDRL_ACTOR_STATS_DIR/actor-<pid>.jsonl``:

``{"pid", "actor_id", "envs", "round_trips", "frames", "seconds", "rtt_p50_ms",
"rtt_p99_ms", "rtt_mean_ms", "rss_mb"}``

When the variable is unset nothing is written (the recorder still costs ~0.2 µs/frame).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

from seedrl.timing import process_rss_mb

STATS_DIR_ENV = "SEEDRL_ACTOR_STATS_DIR"


def percentiles(values: np.ndarray, qs: tuple[float, ...]) -> list[float]:
    """``np.percentile(values, qs)`` (its default linear interpolation) without its cost:
    ``np.percentile`` imports ``numpy.ma``, ~1 MB more RSS in every actor from its first
    flush on, which the benchmark then counted as the actor's own."""
    ordered = np.sort(values)
    last = len(ordered) - 1
    out = []
    for q in qs:
        position = q / 100 * last
        below = int(position)
        above = min(below + 1, last)
        out.append(float(ordered[below] + (ordered[above] - ordered[below]) * (position - below)))
    return out


class RoundTripStats:
    """Ring buffer of recent round-trip seconds plus counts since the last flush."""

    def __init__(self, capacity: int = 1 << 15, directory: str | None = None) -> None:
        self.rtt_s = np.zeros(capacity, np.float64)
        self._mask = capacity - 1
        if capacity & self._mask:
            raise ValueError("capacity must be a power of two")
        self.count = 0
        self._started = 0.0
        directory = directory if directory is not None else os.environ.get(STATS_DIR_ENV)
        self.path = Path(directory) / f"actor-{os.getpid()}.jsonl" if directory else None

    def record(self, seconds: float) -> None:
        """One round trip (the hot path: one store, one increment)."""
        if self.count == 0:
            self._started = time.perf_counter() - seconds
        self.rtt_s[self.count & self._mask] = seconds
        self.count += 1

    def summary(self, actor_id: str, envs: int) -> dict[str, object] | None:
        """Statistics of the round trips since the last flush (None when there were none)."""
        if self.count == 0:
            return None
        recent_ms = self.rtt_s[: min(self.count, self._mask + 1)] * 1e3
        p50, p99 = percentiles(recent_ms, (50, 99))
        return {
            "pid": os.getpid(),
            "actor_id": actor_id,
            "envs": envs,
            "round_trips": self.count,
            "frames": self.count * envs,
            "seconds": time.perf_counter() - self._started,
            "rtt_p50_ms": float(p50),
            "rtt_p99_ms": float(p99),
            "rtt_mean_ms": float(recent_ms.mean()),
            "rss_mb": process_rss_mb(),
        }

    def flush(self, actor_id: str, envs: int) -> None:
        """Append this stream's summary to the stats file (if configured) and reset."""
        record = self.summary(actor_id, envs) if self.path is not None else None
        self.count = 0
        if record is None or self.path is None:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
