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

The metrics never stop a run: each sink fails alone (:class:`MetricsWriter`), a sink that
cannot start is left out with one line saying why (:func:`build_sinks`), and the JSON
lines files are appended whole or not at all (:class:`AppendFile`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar, cast

import numpy as np

from seedrl.config import LearnerConfig, to_json_dict
from seedrl.metrics import EPISODES_FILE, METRICS_FILE

log = logging.getLogger(__name__)

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
S = TypeVar("S")
WANDB_MISSING = "--wandb needs the wandb package: pip install 'seedrl[wandb]'"
WANDB_RUN_ID_FILE = "wandb-run-id"
"""Where a W&B sink keeps its run id in the logdir, so ``--resume`` continues that run."""


class SinkError(RuntimeError):
    """A metrics sink the config asks for cannot start (one line saying which and why)."""


class MetricsSink(Protocol):
    """A destination for metrics records.

    A sink whose write can fail and then work again on the next record (a file on a disk
    that fills and frees) says so with a true ``survives_errors`` class attribute: the
    writer keeps it and tries again; any other sink that fails is taken as broken.
    """

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


class AppendFile:
    """A JSON lines file appended to in whole lines only, so a reader never meets half a line.

    Each write is one unbuffered append of complete lines; when it fails part way (a full
    disk), the file is cut back to where it ended before, so the next write starts on a
    fresh line. A torn last line left by a process killed mid-write is cut off at open.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = open(path, "a+b", buffering=0)  # noqa: SIM115
        _cut_torn_tail(self._file.fileno(), path)

    def write(self, text: str) -> None:
        """Append ``text`` (whole lines, ending in a newline), all of it or none of it."""
        fd = self._file.fileno()
        end = os.fstat(fd).st_size  # appending: the write lands here
        data = memoryview(text.encode())
        try:
            while data:  # a regular file may take part of a write without an error
                data = data[self._file.write(data) or 0 :]
        except BaseException:
            with contextlib.suppress(OSError):  # cutting back frees space, it needs none
                os.ftruncate(fd, end)
            raise

    def close(self) -> None:
        self._file.close()


def _cut_torn_tail(fd: int, path: Path, block: int = 4096) -> None:
    size = os.fstat(fd).st_size
    keep = size
    while keep > 0:
        start = max(0, keep - block)
        newline = os.pread(fd, keep - start, start).rfind(b"\n")
        if newline >= 0:
            keep = start + newline + 1
            break
        keep = start
    if keep < size:
        log.warning(
            "%s ended in a torn line (a write cut short): cut back to its last whole line", path
        )
        os.ftruncate(fd, keep)


class JsonlSink:
    """Appends each record to ``logdir/metrics.jsonl``, one whole line per record."""

    name = METRICS_FILE
    survives_errors = True
    """A failed append leaves the file as it was: the next record is tried as usual."""

    def __init__(self, logdir: str | Path) -> None:
        self._file = AppendFile(Path(logdir) / METRICS_FILE)

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, allow_nan=False, default=_jsonable) + "\n")

    def close(self) -> None:
        self._file.close()


class TensorBoardSink:
    """TensorBoard event files in ``logdir``: every scalar under its namespaced tag.

    Once its writer thread has died (a full disk, no file descriptors) every later call
    raises again: the writer rebuilds it once, then drops it.
    """

    name = "tensorboard"

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

    name = "prometheus"

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

    name = "wandb"

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

    name = EPISODES_FILE
    survives_errors = True

    def __init__(self, logdir: str | Path) -> None:
        self._file = AppendFile(Path(logdir) / EPISODES_FILE)

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

    def close(self) -> None:
        self._file.close()


@dataclasses.dataclass
class SinkSlot(Generic[S]):
    """One sink in a :class:`MetricsWriter` (or its episode log), with what rebuilds it
    and how it fares."""

    sink: S
    name: str
    rebuild: Callable[[], S] | None = None
    """Builds a fresh sink in place of a broken one (None: a broken sink is dropped)."""
    failing: bool = False
    """Its last write failed; said once, and again when it works."""
    rebuilt: bool = False

    @classmethod
    def of(cls, sink: S | SinkSlot[S]) -> SinkSlot[S]:
        """``sink`` itself when it is a slot, else a slot for it (named after its class)."""
        if isinstance(sink, SinkSlot):
            return sink
        return cls(sink, str(getattr(sink, "name", type(sink).__name__)))


class MetricsWriter:
    """Fans every record out to its sinks, and ended episodes to the episode log.

    Each sink fails alone: the others get every record whatever it does. A failure is
    said in one log line, not one per record. A sink that survives errors (the JSON lines
    files) is tried again with the next record; any other is closed and rebuilt once, and
    dropped when it fails again. What was dropped, and what failed to close, is in
    :attr:`failures`, which the run's ``result.json`` records.
    """

    def __init__(
        self,
        sinks: Sequence[MetricsSink | SinkSlot[MetricsSink]],
        episodes: EpisodeLog | None = None,
    ) -> None:
        self.slots: list[SinkSlot[MetricsSink]] = [SinkSlot.of(sink) for sink in sinks]
        self.episodes = None if episodes is None else SinkSlot.of(episodes)
        self.failures: list[str] = []
        """'name: error' for each sink dropped or failing to close, in order."""

    @classmethod
    def from_config(cls, config: LearnerConfig, logdir: str | Path) -> MetricsWriter:
        """The sinks ``config`` asks for (:func:`build_sinks`) and, with
        ``--log-episodes``, the episode log (left out, as a sink, when it cannot start)."""
        failures: list[str] = []
        slots = build_sinks(config, logdir, failures)
        episodes = None
        if config.log_episodes:
            episodes = start_sink(EPISODES_FILE, lambda: EpisodeLog(logdir), failures)
        writer = cls(slots, episodes)
        writer.failures = failures
        return writer

    @property
    def sinks(self) -> list[MetricsSink]:
        """The sinks records go to now."""
        return [slot.sink for slot in self.slots]

    def sink(self, kind: type[SinkT]) -> SinkT | None:
        """The first sink of class ``kind`` (None when there is none)."""
        return next((s for s in self.sinks if isinstance(s, kind)), None)

    def write(self, record: dict[str, Any], ended: Sequence[EndedEpisodes] = ()) -> None:
        """One record to every sink; ``ended`` (the episodes since the last record) to the
        episode log."""
        if self.episodes is not None:
            self.episodes = self._deliver(self.episodes, lambda episodes: episodes.write(ended))
        kept = []
        for slot in self.slots:
            if self._deliver(slot, lambda sink: sink.write(record)) is not None:
                kept.append(slot)
        self.slots = kept

    def close(self) -> list[str]:
        """Close every sink and the episode log, each even when another fails; returns
        :attr:`failures` (each also logged)."""
        slots: list[SinkSlot[Any]] = [*self.slots, *([self.episodes] if self.episodes else [])]
        self.slots, self.episodes = [], None
        for slot in slots:
            try:
                slot.sink.close()
            except Exception as exc:
                log.error("metrics sink %s did not close: %s", slot.name, one_line(exc))
                self.failures.append(f"{slot.name} close: {one_line(exc)}")
        return self.failures

    def _deliver(self, slot: SinkSlot[Any], send: Callable[[Any], None]) -> SinkSlot[Any] | None:
        """Hand ``slot``'s sink one thing; the slot to keep afterwards (None: dropped)."""
        try:
            send(slot.sink)
        except Exception as exc:
            return self._failed(slot, exc)
        if slot.failing:
            log.warning("metrics sink %s written again", slot.name)
            slot.failing = False
        return slot

    def _failed(self, slot: SinkSlot[Any], exc: Exception) -> SinkSlot[Any] | None:
        why = one_line(exc)
        if getattr(slot.sink, "survives_errors", False):
            if not slot.failing:
                log.error("%s not written (the run and the other sinks go on): %s", slot.name, why)
            slot.failing = True
            return slot
        with contextlib.suppress(Exception):  # broken already: its closing words add nothing
            slot.sink.close()
        if slot.rebuild is not None and not slot.rebuilt:
            slot.rebuilt = True
            try:
                slot.sink = slot.rebuild()
            except Exception as again:
                why = f"{why}; rebuilding it: {one_line(again)}"
            else:
                log.error("metrics sink %s failed, rebuilt it (the rest go on): %s", slot.name, why)
                return slot
        log.error("metrics sink %s failed, dropped it (the rest go on): %s", slot.name, why)
        self.failures.append(f"{slot.name} dropped: {why}")
        return None


def build_sinks(
    config: LearnerConfig, logdir: str | Path, failures: list[str] | None = None
) -> list[SinkSlot[MetricsSink]]:
    """``metrics.jsonl`` always; TensorBoard, Prometheus and W&B when ``config`` turns them
    on. A sink this host cannot start now (a full disk, a port in use: an OSError) is left
    out with one line, and 'name not started: why' added to ``failures``; one the config
    cannot have (:class:`SinkError`) stops the run before it serves."""
    logdir = Path(logdir)
    logdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    makers: list[tuple[str, Callable[[], MetricsSink], Callable[[], MetricsSink]]] = []

    def add(name: str, make: Callable[[], MetricsSink], rebuild: Any = None) -> None:
        makers.append((name, make, rebuild or make))

    add(METRICS_FILE, lambda: JsonlSink(logdir))
    if config.tensorboard:
        add("tensorboard", lambda: TensorBoardSink(logdir))
    if config.metrics_port:
        add("prometheus", lambda: PrometheusSink(config.metrics_bind, config.metrics_port))
    if config.wandb:

        def wandb_sink(resume: bool) -> MetricsSink:
            return WandbSink(
                logdir, to_json_dict(config), config.wandb_project,
                config.wandb_entity, config.wandb_mode, resume,
            )  # fmt: skip

        # Rebuilt, it continues the same W&B run (its id is in the logdir by then).
        add("wandb", lambda: wandb_sink(config.resume), lambda: wandb_sink(True))
    slots: list[SinkSlot[MetricsSink]] = []
    try:
        for name, make, rebuild in makers:
            sink = start_sink(name, make, failures)
            if sink is not None:
                slots.append(SinkSlot(sink, name, rebuild))
    except BaseException:
        MetricsWriter(slots).close()  # a sink that cannot start leaves no port or file open
        raise
    return slots


def start_sink(
    name: str, make: Callable[[], SinkT], failures: list[str] | None = None
) -> SinkT | None:
    """``make()``, or None when it raises OSError (said in one line, and added to
    ``failures``): the run goes on without that sink."""
    try:
        return make()
    except OSError as exc:
        log.error(
            "metrics sink %s not started (the run goes on without it): %s", name, one_line(exc)
        )
        if failures is not None:
            failures.append(f"{name} not started: {one_line(exc)}")
        return None


def one_line(exc: BaseException, limit: int = 200) -> str:
    """An exception as one short line, for a log line or result.json."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON serialisable: {value!r}")
