"""The actor's round-trip metric: how long it waits for its actions, as only it can see.

The learner counts frames but cannot see an actor's wait (write frame -> actions read).
``RoundTripStats`` keeps the last ``capacity`` round-trip times in a preallocated ring
buffer, always on (two ``perf_counter`` calls and one array store per frame, no
allocation), and when a stream ends appends one JSON line to
``<--stats-dir>/actor-<pid>.jsonl`` if that flag is set:

``{"pid", "actor_id", "envs", "round_trips", "frames", "seconds", "rtt_p50_ms",
"rtt_p99_ms", "rtt_mean_ms", "rss_mb"}``
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

from seedrl.timing import process_rss_mb


def percentiles(values: np.ndarray, qs: tuple[float, ...]) -> list[float]:
    """``np.percentile(values, qs)`` (its default linear interpolation) without its cost:
    ``np.percentile`` imports ``numpy.ma``, which would grow every actor's memory from its
    first flush on."""
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

    def __init__(self, capacity: int = 1 << 15, directory: str = "") -> None:
        self.rtt_s = np.zeros(capacity, np.float64)
        self._mask = capacity - 1
        if capacity & self._mask:
            raise ValueError("capacity must be a power of two")
        self.count = 0
        self._started = 0.0
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
