"""Process control for the benchmark: the actor fleet, stopping servers, waiting.

The N actors of a sweep point are started once, by one ``python -m actors`` launcher
(forked or exec'd as a user's would be), and outlive the servers that take turns behind
their address (they reconnect with a short backoff).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.bench.procfs import child_pids, shared_aware_mb, tree_cpu_seconds
from seedrl.commands import actors_command
from seedrl.config import ActorConfig
from seedrl.timing import process_rss_mb


def stop_process(proc: subprocess.Popen[Any], grace: float = 10.0) -> None:
    """SIGTERM, a bounded wait, then SIGKILL."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


class ActorFleet:
    """N actors started as ``python -m actors`` starts them (one launcher, the same flags),
    outliving the servers of a point."""

    def __init__(
        self,
        address: str,
        n: int,
        k: int,
        groups: int,
        stats_dir: Path,
        extra: Sequence[str],
        pin_cpus: str,
    ) -> None:
        self.groups = groups
        self.stats_dir = stats_dir
        stats_dir.mkdir(parents=True, exist_ok=True)
        self.launcher = subprocess.Popen(
            self.command(address, n, k, groups, pin_cpus, stats_dir, extra),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    @staticmethod
    def command(
        address: str,
        n: int,
        k: int,
        groups: int,
        pin_cpus: str,
        stats_dir: Path,
        extra: Sequence[str] = (),
    ) -> list[str]:
        """``python -m actors`` for N actors x K envs that reconnect fast; the user's
        ``--actor-args`` come last, so they win."""
        config = ActorConfig(
            learner=address,
            num_actors=n,
            envs_per_actor=k,
            env_groups=groups,
            first_index=0,
            max_backoff_s=0.3,
            pin_cpus=pin_cpus,
            stats_dir=str(stats_dir),
        )
        return [*actors_command(config), *extra]

    def actor_pids(self) -> list[int]:
        """The live actor processes (the launcher's children)."""
        return child_pids(self.launcher.pid)

    def cpu_seconds(self) -> float:
        """CPU of the live actors and of the launcher (which sleeps between polls)."""
        return tree_cpu_seconds(self.launcher.pid)

    def rss_mb(self) -> list[float]:
        return [rss for rss in map(process_rss_mb, self.actor_pids()) if rss > 0]

    def shared_aware_mb(self) -> list[tuple[float, float]]:
        """(USS, PSS) of every live actor."""
        found = (shared_aware_mb(pid) for pid in self.actor_pids())
        return [x for x in found if x is not None]

    def stream_records(self) -> list[dict[str, Any]]:
        """Every per-stream record the actors have flushed so far."""
        records = []
        for path in sorted(self.stats_dir.glob("actor-*.jsonl")):
            records += [json.loads(line) for line in path.read_text().splitlines() if line]
        return records

    def stop(self) -> None:
        """The launcher stops its actors (SIGTERM, then SIGKILL after its grace period)."""
        stop_process(self.launcher, grace=15.0)


def wait_for(predicate: Any, timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False
