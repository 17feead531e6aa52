"""Metrics sinks: ``metrics.jsonl`` (one JSON object per log interval) and TensorBoard.

Records use flat keys (``frames``, ``fps``, ``episode_return_mean``, ``loss_policy``);
TensorBoard gets the same scalars under namespaced tags (``perf/fps``,
``episode/return_mean``, ``losses/policy``) with the frame count as the step.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"

_TAG_PREFIXES = (
    ("loss_", "losses/"),
    ("episode_", "episode/"),
)
_LEARNER_KEYS = {
    "learner_steps",
    "learner_steps_per_s",
    "entropy",
    "grad_norm",
    "policy_lag",
    "rho_mean",
    "value_mean",
    "nonfinite_skipped",
}
_SKIP_TB = {"time", "elapsed_s", "frames"}


def tensorboard_tag(key: str) -> str:
    """Namespaced TensorBoard tag for a flat metrics key."""
    for prefix, group in _TAG_PREFIXES:
        if key.startswith(prefix):
            return group + key[len(prefix) :]
    if key in _LEARNER_KEYS:
        return "learner/" + key
    return "perf/" + key


class MetricsWriter:
    """Appends records to ``logdir/metrics.jsonl`` and mirrors them to TensorBoard."""

    def __init__(self, logdir: str | Path, tensorboard: bool = True) -> None:
        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        self._jsonl = open(self.logdir / METRICS_FILE, "a", buffering=1)  # noqa: SIM115
        self._tb: Any = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.logdir))

    def write(self, record: dict[str, Any]) -> None:
        self._jsonl.write(json.dumps(record, allow_nan=False, default=_jsonable) + "\n")
        if self._tb is not None:
            step = int(record.get("frames", 0))
            for key, value in record.items():
                if key in _SKIP_TB or not isinstance(value, int | float) or isinstance(value, bool):
                    continue
                if math.isfinite(value):
                    self._tb.add_scalar(tensorboard_tag(key), value, step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
            self._tb = None
        self._jsonl.close()


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON serialisable: {value!r}")


def read_metrics(logdir: str | Path) -> list[dict[str, Any]]:
    """All records of a run's metrics.jsonl (empty list when there are none)."""
    path = Path(logdir) / METRICS_FILE
    if not path.exists():
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
