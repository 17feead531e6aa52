"""What a learner run leaves behind that tools on either side read: ``metrics.jsonl``
(one JSON object per log interval), ``episodes.jsonl`` (one per finished episode) and
the final :class:`RunResult`.

The sinks that write them (and TensorBoard, Prometheus) are the learner's:
:mod:`learner.metrics`.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"
EPISODES_FILE = "episodes.jsonl"


@dataclass
class RunResult:
    """What a finished run reports (also printed as the final summary line)."""

    reason: str
    frames: int
    learner_steps: int
    episodes: int
    episode_return_mean: float | None
    wall_time_s: float
    solved: bool


def read_metrics(logdir: str | Path) -> list[dict[str, Any]]:
    """All records of a run's metrics.jsonl (empty list when there are none).

    A line that does not parse is one the learner is still writing: it is left out.
    """
    return _read_jsonl(Path(logdir) / METRICS_FILE)


def read_episodes(logdir: str | Path) -> list[dict[str, Any]]:
    """All records of a run's episodes.jsonl (``frames``, ``elapsed_s``, ``return``,
    ``length``), oldest first; empty when the run kept none (``--no-log-episodes``)."""
    return _read_jsonl(Path(logdir) / EPISODES_FILE)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    records = []
    with open(path) as f:
        for line in f:
            with contextlib.suppress(json.JSONDecodeError):
                records.append(json.loads(line))
    return records
