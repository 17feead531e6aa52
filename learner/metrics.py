"""The learner's metrics sinks: one small interface, one class per destination.

A :class:`MetricsSink` takes each record (a flat dict, one per log interval) and is
closed at the end; :class:`MetricsWriter` fans every record out to the sinks the config
asks for (:func:`build_sinks`):

- :class:`JsonlSink`: ``metrics.jsonl``, one JSON object per line (always on);
- :class:`TensorBoardSink`: the same scalars under namespaced tags (``perf/fps``,
  ``episode/return_mean``, ``losses/policy``) with the frame count as the step;
- :class:`PrometheusSink`: an HTTP ``/metrics`` endpoint serving the latest record's
  numbers as gauges named ``seedrl_<key>`` (``seedrl_fps``, ``seedrl_loss_policy``);
- :class:`WandbSink`: a Weights & Biases run holding the resolved config (secrets left
  out) and the TensorBoard tags as curves over frames (the ``wandb`` extra).

Beside the sinks, :class:`EpisodeLog` appends one line per finished episode to
``episodes.jsonl``, so a learning curve can start at the first episode.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

import numpy as np

from seedrl.config import LearnerConfig, to_json_dict
from seedrl.metrics import EPISODES_FILE, METRICS_FILE

_TAG_PREFIXES = (
    ("loss_", "losses/"),
    ("episode_", "episode/"),
    ("collapse_", "collapse/"),
    ("elo_", "elo/"),  # self-play ratings (learner.league)
    ("selfplay_", "selfplay/"),
    ("vs_", "selfplay/vs_"),
)
_LEARNER_KEYS = {
    "learner_steps",
    "learner_steps_per_s",
    "entropy",
    "entropy_fraction",
    "grad_norm",
    "policy_lag",
    "learning_rate",
    "rho_mean",
    "value_mean",
    "value_target_mean",
    "nonfinite_skipped",
}
_SKIP_TB = {"time", "elapsed_s", "frames"}
SinkT = TypeVar("SinkT")
WANDB_MISSING = "--wandb needs the wandb package: pip install 'seedrl[wandb]'"
WANDB_RUN_ID_FILE = "wandb-run-id"
"""Where a W&B sink keeps its run id in the logdir, so ``--resume`` continues that run."""


class SinkError(RuntimeError):
    """A metrics sink the config asks for cannot start (one line saying which and why)."""


class MetricsSink(Protocol):
    """A destination for metrics records."""

    def write(self, record: dict[str, Any]) -> None:
        """Take one record (flat keys; values numbers, None or strings)."""
        ...

    def close(self) -> None:
        """Flush and release what the sink holds; no writes follow."""
        ...


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


def scalars(record: dict[str, Any]) -> Iterator[tuple[str, float]]:
    """The record's finite numbers as (tag, value), as TensorBoard and W&B show them.

    Clock keys and the frame count (the x axis) are left out; booleans are not numbers.
    """
    for key, value in record.items():
        if key in _SKIP_TB or not isinstance(value, int | float) or isinstance(value, bool):
            continue
        if math.isfinite(value):
            yield tensorboard_tag(key), value


class JsonlSink:
    """Appends each record to ``logdir/metrics.jsonl`` (line-buffered: readers see whole lines)."""

    def __init__(self, logdir: str | Path) -> None:
        self._file = open(Path(logdir) / METRICS_FILE, "a", buffering=1)  # noqa: SIM115

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, allow_nan=False, default=_jsonable) + "\n")

    def close(self) -> None:
        self._file.close()


class TensorBoardSink:
    """TensorBoard event files in ``logdir``: every scalar under its namespaced tag."""

    def __init__(self, logdir: str | Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._tb = SummaryWriter(log_dir=str(logdir))

    def write(self, record: dict[str, Any]) -> None:
        step = int(record.get("frames", 0))
        for tag, value in scalars(record):
            self._tb.add_scalar(tag, value, step)

    def close(self) -> None:
        self._tb.flush()
        self._tb.close()


class PrometheusSink:
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

    def write(self, record: dict[str, Any]) -> None:
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


class WandbSink:
    """A Weights & Biases run: the resolved config (secrets left out) and every scalar.

    Curves use TensorBoard's tags with ``frames`` as their x axis. The run id is kept in
    ``logdir`` so that ``--resume`` continues the same W&B run. wandb's record of the
    command line is turned off: a token given as ``--auth-token`` would be in it.
    Offline mode writes the run under ``logdir/wandb`` for a later ``wandb sync``.
    """

    def __init__(
        self,
        logdir: str | Path,
        config: dict[str, Any],
        project: str,
        entity: str | None = None,
        mode: str = "online",
        resume: bool = False,
    ) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise SinkError(WANDB_MISSING) from exc

        logdir = Path(logdir)
        id_file = logdir / WANDB_RUN_ID_FILE
        run_id = id_file.read_text().strip() if resume and id_file.exists() else None
        try:
            self._run = wandb.init(
                project=project,
                entity=entity,
                mode=cast(Any, mode),  # checked against WANDB_MODES by the config
                dir=str(logdir),
                config=config,
                id=run_id,
                resume="allow" if run_id else None,
                settings=wandb.Settings(x_disable_meta=True, console="off", save_code=False),
            )
        except wandb.errors.Error as exc:  # not logged in, server unreachable
            first_line = (
                str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            )
            raise SinkError(
                f"--wandb: {first_line} (--wandb-mode offline needs no account or network)"
            ) from exc
        id_file.write_text(self._run.id + "\n")
        self._run.define_metric("frames")
        self._run.define_metric("*", step_metric="frames")

    def write(self, record: dict[str, Any]) -> None:
        values = dict(scalars(record))
        if values:
            self._run.log({"frames": int(record.get("frames", 0)), **values})

    def close(self) -> None:
        self._run.finish()


EndedEpisodes = tuple[int, float, np.ndarray, np.ndarray]
"""Episodes that ended in one inference batch: (frames, elapsed_s, return_E, length_E)."""


class EpisodeLog:
    """Appends one line per finished episode to ``logdir/episodes.jsonl``: the frame count
    and run time when it ended, its raw return and its length (SB3's Monitor file, as
    JSON lines), so a learning curve can start at the first episode."""

    def __init__(self, logdir: str | Path) -> None:
        self._file = open(Path(logdir) / EPISODES_FILE, "a")  # noqa: SIM115

    def write(self, ended: Sequence[EndedEpisodes]) -> None:
        # Formatted by hand: this runs on the event loop for every episode, and a finite
        # float's repr is its JSON (rewards are finite: the wire guard rejects NaN and inf).
        lines = [
            f'{{"frames": {frames}, "elapsed_s": {elapsed:.3f}, "return": {r!r}, "length": {n}}}'
            for frames, elapsed, return_E, length_E in ended
            for r, n in zip(return_E.tolist(), length_E.tolist(), strict=True)
        ]
        if lines:
            self._file.write("\n".join(lines) + "\n")
            self._file.flush()

    def close(self) -> None:
        self._file.close()


class MetricsWriter:
    """Fans every record out to its sinks, and ended episodes to the episode log."""

    def __init__(self, sinks: Sequence[MetricsSink], episodes: EpisodeLog | None = None) -> None:
        self.sinks = list(sinks)
        self.episodes = episodes

    @classmethod
    def from_config(cls, config: LearnerConfig, logdir: str | Path) -> MetricsWriter:
        """The sinks ``config`` asks for (:func:`build_sinks`) and, with
        ``--log-episodes``, the episode log."""
        sinks = build_sinks(config, logdir)
        return cls(sinks, EpisodeLog(logdir) if config.log_episodes else None)

    def sink(self, kind: type[SinkT]) -> SinkT | None:
        """The first sink of class ``kind`` (None when there is none)."""
        return next((s for s in self.sinks if isinstance(s, kind)), None)

    def write(self, record: dict[str, Any], ended: Sequence[EndedEpisodes] = ()) -> None:
        """One record to every sink; ``ended`` (the episodes since the last record) to the
        episode log."""
        if self.episodes is not None:
            self.episodes.write(ended)
        for sink in self.sinks:
            sink.write(record)

    def close(self) -> None:
        # Every sink gets closed even when one fails; a failure is raised after the rest.
        with contextlib.ExitStack() as stack:
            for sink in self.sinks:
                stack.callback(sink.close)
            if self.episodes is not None:
                stack.callback(self.episodes.close)
            self.sinks, self.episodes = [], None


def build_sinks(config: LearnerConfig, logdir: str | Path) -> list[MetricsSink]:
    """``metrics.jsonl`` always; TensorBoard, Prometheus and W&B when ``config`` turns them on."""
    logdir = Path(logdir)
    logdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    sinks: list[MetricsSink] = [JsonlSink(logdir)]
    try:
        if config.tensorboard:
            sinks.append(TensorBoardSink(logdir))
        if config.metrics_port:
            sinks.append(PrometheusSink(config.bind, config.metrics_port))
        if config.wandb:
            sinks.append(
                WandbSink(
                    logdir, to_json_dict(config), config.wandb_project,
                    config.wandb_entity, config.wandb_mode, config.resume,
                )
            )  # fmt: skip
    except BaseException:
        MetricsWriter(sinks).close()  # a sink that cannot start leaves no port or file open
        raise
    return sinks


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON serialisable: {value!r}")
