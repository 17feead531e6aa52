"""Phase timing on the monotonic clock (never ``time.time()`` for durations) and RSS readings."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class PhaseTimer:
    """Accumulates seconds per named phase; thread-safe; ``drain`` returns and resets."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(phase, time.perf_counter() - start)

    def add(self, phase: str, seconds: float) -> None:
        with self._lock:
            self._seconds[phase] = self._seconds.get(phase, 0.0) + seconds

    def drain(self) -> dict[str, float]:
        with self._lock:
            out, self._seconds = self._seconds, {}
        return out


def process_rss_mb(pid: int | None = None) -> float:
    """Resident set size of this process (or ``pid``) in MiB (Linux; 0 elsewhere or when gone)."""
    try:
        with open(f"/proc/{pid or 'self'}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return 0.0
