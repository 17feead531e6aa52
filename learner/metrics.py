"""The learner's metrics sinks: ``metrics.jsonl`` (a JSON object per log interval),
TensorBoard, Prometheus.

Records use flat keys (``frames``, ``fps``, ``episode_return_mean``, ``loss_policy``);
TensorBoard gets the same scalars under namespaced tags (``perf/fps``,
``episode/return_mean``, ``losses/policy``) with the frame count as the step. With a
metrics port, an HTTP ``/metrics`` endpoint serves the latest record's numbers as
Prometheus gauges named ``seedrl_<key>`` (``seedrl_fps``, ``seedrl_loss_policy``).
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from seedrl.metrics import METRICS_FILE

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
    "learning_rate",
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


def prometheus_name(key: str) -> str:
    """The Prometheus metric name for a flat metrics key."""
    return "seedrl_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)


class PrometheusExporter:
    """Serves the latest metrics record on ``http://ADDR:PORT/metrics`` (prometheus-client).

    A collector on its own registry turns the record into gauges at scrape time, so the
    endpoint always shows exactly what the last metrics.jsonl line holds.
    """

    def __init__(self, addr: str, port: int) -> None:
        from prometheus_client import CollectorRegistry, start_http_server

        self._record: dict[str, Any] = {}
        self._lock = threading.Lock()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        self._server, self._thread = start_http_server(port, addr=addr, registry=registry)
        self.port = int(self._server.server_port)

    def update(self, record: dict[str, Any]) -> None:
        with self._lock:
            self._record = dict(record)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        with self._lock:
            record = self._record
        for key, value in record.items():
            if key == "time" or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if math.isfinite(value):
                yield GaugeMetricFamily(prometheus_name(key), f"seedrl {key}", value=value)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class MetricsWriter:
    """Appends records to ``logdir/metrics.jsonl`` and mirrors them to TensorBoard/Prometheus."""

    def __init__(
        self,
        logdir: str | Path,
        tensorboard: bool = True,
        prometheus: tuple[str, int] | None = None,
    ) -> None:
        self.logdir = Path(logdir)
        self.logdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._jsonl = open(self.logdir / METRICS_FILE, "a", buffering=1)  # noqa: SIM115
        self._tb: Any = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.logdir))
        self.prometheus: PrometheusExporter | None = None
        if prometheus is not None:
            self.prometheus = PrometheusExporter(*prometheus)

    def write(self, record: dict[str, Any]) -> None:
        self._jsonl.write(json.dumps(record, allow_nan=False, default=_jsonable) + "\n")
        if self.prometheus is not None:
            self.prometheus.update(record)
        if self._tb is not None:
            step = int(record.get("frames", 0))
            for key, value in record.items():
                if key in _SKIP_TB or not isinstance(value, int | float) or isinstance(value, bool):
                    continue
                if math.isfinite(value):
                    self._tb.add_scalar(tensorboard_tag(key), value, step)

    def close(self) -> None:
        if self.prometheus is not None:
            self.prometheus.close()
            self.prometheus = None
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
            self._tb = None
        self._jsonl.close()


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON serialisable: {value!r}")
