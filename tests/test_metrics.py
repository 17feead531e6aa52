"""The metrics sinks behind one interface, the per-episode log, W&B offline, the curve."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from learner.metrics import (
    JsonlSink,
    MetricsWriter,
    PrometheusSink,
    SinkSlot,
    TensorBoardSink,
    WandbSink,
    build_sinks,
)
from learner.state.stats import LearnerStats
from learner.state.trajectories import FinishedEpisodes
from learner.tools.plot import return_curve, trailing_mean
from seedrl.config import AUTH_TOKEN_ENV, LearnerConfig
from seedrl.metrics import read_episodes, read_metrics
from seedrl.transport import free_port

ROOT = Path(__file__).resolve().parent.parent

TOKEN = "s3cret-token-never-sent"
RECORD = {"time": 1.0, "elapsed_s": 2.0, "frames": 640, "fps": 320.0, "episodes": 3,
          "episode_return_mean": 21.5, "loss_policy": -0.25, "entropy": 0.69,
          "episode_length_mean": None, "actors_connected": 2}  # fmt: skip


class Recorder:
    """A sink that keeps what it is given (and can fail on close)."""

    def __init__(self, log: list[Any], name: str, fail_close: bool = False) -> None:
        self.log, self.name, self.fail_close = log, name, fail_close

    def write(self, record: dict[str, Any]) -> None:
        self.log.append((self.name, "write", record["frames"]))

    def close(self) -> None:
        self.log.append((self.name, "close"))
        if self.fail_close:
            raise OSError(f"{self.name} could not flush")


def test_writer_hands_each_record_to_every_sink_and_closes_all_even_after_a_failure(caplog):
    log: list[Any] = []
    writer = MetricsWriter([Recorder(log, "a", fail_close=True), Recorder(log, "b")])
    writer.write({"frames": 1})
    writer.write({"frames": 2})
    with caplog.at_level("ERROR", logger="learner.metrics"):
        failures = writer.close()  # said and returned (for result.json), never raised
    assert failures == ["a close: a could not flush"]
    assert [r.getMessage() for r in caplog.records] == [
        "metrics sink a did not close: a could not flush"
    ]
    writes = [entry for entry in log if entry[1] == "write"]
    assert writes == [("a", "write", 1), ("b", "write", 1), ("a", "write", 2), ("b", "write", 2)]
    assert {entry for entry in log if entry[1] == "close"} == {("a", "close"), ("b", "close")}
    assert writer.sinks == []


class FullDisk:
    """A file sink on a disk that is full until ``free`` is set."""

    survives_errors = True

    def __init__(self) -> None:
        self.free = False
        self.frames: list[int] = []

    def write(self, record: dict[str, Any]) -> None:
        if not self.free:
            raise OSError(28, "No space left on device")
        self.frames.append(record["frames"])

    def close(self) -> None:
        pass


def test_a_full_disk_loses_records_not_the_run(caplog):
    sink, log = FullDisk(), []
    writer = MetricsWriter([sink, Recorder(log, "other")])
    with caplog.at_level("WARNING", logger="learner.metrics"):
        writer.write({"frames": 1})
        writer.write({"frames": 2})
        sink.free = True
        writer.write({"frames": 3})
    assert sink.frames == [3]
    assert [entry[2] for entry in log] == [1, 2, 3]  # the other sink missed nothing
    said = [r.getMessage() for r in caplog.records]
    assert len([m for m in said if "FullDisk not written" in m]) == 1, said
    assert "metrics sink FullDisk written again" in said
    assert writer.failures == []


class Broken:
    """A sink broken for good, as TensorBoard's is once its writer thread died."""

    name = "broken"

    def __init__(self, built: list[Broken]) -> None:
        built.append(self)
        self.closed = False

    def write(self, record: dict[str, Any]) -> None:
        raise OSError(24, "Too many open files")

    def close(self) -> None:
        self.closed = True
        raise OSError(24, "Too many open files")


def test_a_broken_sink_is_rebuilt_once_then_dropped_while_the_others_go_on(caplog):
    log: list[Any] = []
    built: list[Broken] = []
    slot = SinkSlot(Broken(built), "broken", rebuild=lambda: Broken(built))
    writer = MetricsWriter([slot, Recorder(log, "after")])
    with caplog.at_level("WARNING", logger="learner.metrics"):
        for frames in range(1, 6):
            writer.write({"frames": frames})
    assert [entry[2] for entry in log] == [1, 2, 3, 4, 5]
    assert len(built) == 2 and all(b.closed for b in built)  # rebuilt once, both released
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said  # one line when rebuilt, one when dropped; none per record
    assert "rebuilt it" in said[0] and "dropped it" in said[1]
    assert writer.failures == ["broken dropped: [Errno 24] Too many open files"]
    assert writer.close() == writer.failures  # the dropped sink is not closed again


def test_a_dead_tensorboard_writer_stops_neither_prometheus_nor_metrics_jsonl(
    tmp_path, monkeypatch
):
    def dead(self: TensorBoardSink, record: dict[str, Any]) -> None:
        raise OSError(28, "No space left on device")  # as the dead writer thread's error

    monkeypatch.setattr(TensorBoardSink, "write", dead)
    config = LearnerConfig(tensorboard=True, metrics_port=free_port())
    writer = MetricsWriter.from_config(config, tmp_path)
    assert [type(s) for s in writer.sinks] == [JsonlSink, TensorBoardSink, PrometheusSink]
    prometheus = writer.sink(PrometheusSink)
    for frames in (100, 200, 300):
        writer.write({**RECORD, "frames": frames})
    url = f"http://127.0.0.1:{prometheus.port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as reply:
        scraped = reply.read().decode()
    writer.close()
    assert "seedrl_frames 300.0" in scraped
    assert [r["frames"] for r in read_metrics(tmp_path)] == [100, 200, 300]
    assert writer.failures == ["tensorboard dropped: [Errno 28] No space left on device"]


class TornWrite:
    """A real file that takes the first ``keep`` bytes of a write, then reports a full disk."""

    def __init__(self, raw: Any, keep: int) -> None:
        self.raw, self.keep = raw, keep

    def write(self, data: memoryview) -> int:
        if self.keep is not None:
            taken = self.raw.write(data[: self.keep])
            self.keep = None
            return taken
        raise OSError(28, "No space left on device")

    def fileno(self) -> int:
        return self.raw.fileno()

    def close(self) -> None:
        self.raw.close()


def test_a_write_cut_short_by_a_full_disk_leaves_no_torn_line(tmp_path):
    sink = JsonlSink(tmp_path)
    sink.write({"frames": 1})
    sink._file._file = TornWrite(sink._file._file, keep=7)  # half a line, then ENOSPC
    with pytest.raises(OSError, match="No space"):
        sink.write({"frames": 2, "fps": 3.5})
    assert (tmp_path / "metrics.jsonl").read_text() == '{"frames": 1}\n'
    sink._file._file = sink._file._file.raw  # room again: the next line starts fresh
    sink.write({"frames": 3})
    sink.close()
    assert (tmp_path / "metrics.jsonl").read_text() == '{"frames": 1}\n{"frames": 3}\n'


def test_a_torn_line_left_by_a_killed_writer_is_cut_at_open(tmp_path, caplog):
    (tmp_path / "metrics.jsonl").write_text('{"frames": 1}\n{"frames": 2, "fp')
    with caplog.at_level("WARNING", logger="learner.metrics"):
        sink = JsonlSink(tmp_path)
    sink.write({"frames": 3})
    sink.close()
    assert (tmp_path / "metrics.jsonl").read_text() == '{"frames": 1}\n{"frames": 3}\n'
    assert any("torn line" in r.getMessage() for r in caplog.records)


def test_a_sink_that_cannot_start_is_left_out_and_the_rest_start(tmp_path, monkeypatch, caplog):
    def full(self: TensorBoardSink, logdir: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(TensorBoardSink, "__init__", full)
    with caplog.at_level("ERROR", logger="learner.metrics"):
        writer = MetricsWriter.from_config(LearnerConfig(tensorboard=True), tmp_path)
    assert [type(s) for s in writer.sinks] == [JsonlSink]
    writer.write({"frames": 1})
    assert writer.close() == ["tensorboard not started: [Errno 28] No space left on device"]
    assert read_metrics(tmp_path) == [{"frames": 1}]
    assert len(caplog.records) == 1


def test_prometheus_listens_on_metrics_bind_not_on_bind(tmp_path):
    config = LearnerConfig(tensorboard=False, bind="127.0.0.2", metrics_port=free_port())
    writer = MetricsWriter.from_config(config, tmp_path)
    try:
        prometheus = writer.sink(PrometheusSink)
        assert prometheus is not None
        assert prometheus._server.server_address[0] == "127.0.0.1"
    finally:
        writer.close()


def test_the_config_picks_the_sinks(tmp_path):
    def kinds(**kw: Any) -> list[type]:
        writer = MetricsWriter(build_sinks(LearnerConfig(**kw), tmp_path))
        try:
            return [type(sink) for sink in writer.sinks]
        finally:
            writer.close()

    assert kinds(tensorboard=False) == [JsonlSink]
    assert kinds(tensorboard=True) == [JsonlSink, TensorBoardSink]
    port = free_port()
    assert kinds(tensorboard=False, metrics_port=port) == [JsonlSink, PrometheusSink]


def test_jsonl_tensorboard_and_prometheus_get_the_same_record(tmp_path):
    config = LearnerConfig(tensorboard=True, metrics_port=free_port())
    writer = MetricsWriter.from_config(config, tmp_path)
    writer.write(RECORD)
    prometheus = writer.sink(PrometheusSink)
    url = f"http://127.0.0.1:{prometheus.port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as reply:
        scraped = reply.read().decode()
    writer.close()

    assert read_metrics(tmp_path) == [RECORD]
    assert "seedrl_fps 320.0" in scraped and "seedrl_loss_policy -0.25" in scraped
    assert "seedrl_episode_length_mean" not in scraped  # None is not a number

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {
        "perf/fps", "perf/episodes", "perf/actors_connected", "episode/return_mean",
        "losses/policy", "learner/entropy",
    }  # fmt: skip
    (point,) = events.Scalars("losses/policy")
    assert (point.step, point.value) == (640, -0.25)


def test_the_episode_log_has_one_line_per_ended_episode(tmp_path):
    stats = LearnerStats(log_episodes=True)
    stats.on_batch(64, None)
    stats.on_batch(64, FinishedEpisodes(np.array([10.0, 12.5]), np.array([10, 13])))
    stats.on_batch(64, FinishedEpisodes(np.array([30.0]), np.array([30])))
    writer = MetricsWriter.from_config(LearnerConfig(tensorboard=False), tmp_path)
    writer.write(stats.snapshot(), stats.drain_episodes())
    assert stats.drain_episodes() == []  # drained once
    stats.on_batch(64, FinishedEpisodes(np.array([9.0, 1e-20]), np.array([9, 4])))
    writer.write(stats.snapshot(), stats.drain_episodes())
    writer.close()

    episodes = read_episodes(tmp_path)
    assert [(e["frames"], e["return"], e["length"]) for e in episodes] == [
        (128, 10.0, 10), (128, 12.5, 13), (192, 30.0, 30), (256, 9.0, 9), (256, 1e-20, 4),
    ]  # fmt: skip
    elapsed = [e["elapsed_s"] for e in episodes]
    # to the millisecond the line keeps: no later than the record that followed
    assert elapsed == sorted(elapsed)
    assert elapsed[-1] <= read_metrics(tmp_path)[-1]["elapsed_s"] + 0.0005
    # Off: nothing is kept, so nothing grows unread.
    quiet = LearnerStats()
    quiet.on_batch(64, FinishedEpisodes(np.array([1.0]), np.array([1])))
    assert quiet.drain_episodes() == []
    off = MetricsWriter.from_config(LearnerConfig(log_episodes=False), tmp_path / "off")
    assert off.episodes is None
    off.close()


def test_the_curve_starts_at_the_first_episode_with_the_mean_of_the_last_100(tmp_path):
    rng = np.random.default_rng(0)
    returns = rng.uniform(0, 500, size=250)
    with open(tmp_path / "episodes.jsonl", "w") as f:
        for i, r in enumerate(returns):
            f.write(json.dumps({"frames": 10 * i, "elapsed_s": 0.1 * i, "return": r, "length": 1}))
            f.write("\n")
    curve = return_curve(tmp_path)
    assert curve.episodes and len(curve.frames) == 250 and curve.frames[0] == 0
    slow = [sum(returns[max(0, i - 99) : i + 1]) / len(returns[max(0, i - 99) : i + 1])
            for i in range(250)]  # fmt: skip
    np.testing.assert_allclose(curve.mean, slow, rtol=1e-12)
    np.testing.assert_allclose(trailing_mean(np.array([1.0, 2.0, 6.0]), 2), [1.0, 1.5, 4.0])

    # A run without the episode log: one point per metrics record that has a mean.
    old = tmp_path / "old"
    old.mkdir()
    records = [{"frames": 0, "elapsed_s": 1.0, "episode_return_mean": None},
               {"frames": 900, "elapsed_s": 3.0, "episode_return_mean": 42.0}]  # fmt: skip
    (old / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    curve = return_curve(old)
    assert not curve.episodes and curve.frames.tolist() == [900] and curve.mean.tolist() == [42.0]


def wandb_records(run_file: Path) -> list[Any]:
    """The records of an offline W&B run file: leveldb-log framing (a 7-byte file header,
    32 KiB blocks, chunks of CRC32 + length + type), each record a wandb ``Record`` proto."""
    from wandb.proto.wandb_internal_pb2 import Record

    data = run_file.read_bytes()
    assert data[:4] == b":W&B", data[:8]
    block, pos, pending, records = 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if pos + 7 + length > len(data):  # a chunk still being written
            break
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last chunk of one
            records.append(Record.FromString(pending))
            pending = b""
    return records


def test_wandb_offline_run_has_the_config_and_curves_and_never_the_token(tmp_path, monkeypatch):
    """The W&B sink, offline (no network, no account): the resolved config without the
    token, every scalar over frames, and the token nowhere in what wandb wrote, though it
    was in the config, the environment and the command line."""
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv(AUTH_TOKEN_ENV, TOKEN)
    monkeypatch.setattr(sys, "argv", ["learner", "--auth-token", TOKEN, "--wandb"])
    config = LearnerConfig(
        env="CartPole-v1", auth_token=TOKEN, wandb=True, wandb_mode="offline",
        wandb_project="seedrl-test", tensorboard=False, logdir=str(tmp_path),
    )  # fmt: skip
    try:
        writer = MetricsWriter.from_config(config, tmp_path)
        assert [type(s) for s in writer.sinks] == [JsonlSink, WandbSink]
        for i in range(3):
            writer.write({**RECORD, "frames": 1000 * (i + 1), "fps": 100.0 + i})
        writer.close()
    finally:
        wandb.teardown()  # ends the service process wandb started for this one

    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    records = wandb_records(run_file)
    kinds = [r.WhichOneof("record_type") for r in records]
    assert "exit" in kinds, kinds  # the whole run, to its end
    runs = [r.run for r, kind in zip(records, kinds, strict=True) if kind == "run"]
    assert len(runs) == 1, kinds
    run = runs[0]
    config_items = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert run.project == "seedrl-test"
    assert config_items["env"] == "CartPole-v1" and config_items["wandb_mode"] == "offline"
    assert "auth_token" not in config_items
    history = [
        {
            "/".join(item.nested_key) or item.key: json.loads(item.value_json)
            for item in r.history.item
        }
        for r, kind in zip(records, kinds, strict=True)
        if kind == "history"
    ]
    assert [(h["frames"], h["perf/fps"], h["losses/policy"]) for h in history] == [
        (1000, 100.0, -0.25), (2000, 101.0, -0.25), (3000, 102.0, -0.25),
    ]  # fmt: skip
    assert (tmp_path / "wandb-run-id").read_text().strip() in run_file.name
    for written in tmp_path.rglob("*"):
        if written.is_file():
            assert TOKEN.encode() not in written.read_bytes(), written


def test_wandb_without_the_package_exits_2_naming_the_flag(monkeypatch, capsys):
    import learner.__main__ as cli

    monkeypatch.setattr(cli, "find_spec", lambda name: None if name == "wandb" else object())
    assert cli.train_main(["--wandb"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("python -m learner: error: --wandb needs the wandb package"), line


def test_wandb_without_an_account_exits_2_in_one_line(tmp_path):
    """Online mode with no W&B login: the learner stops before serving, in one line that
    names the flag and the offline way out (wandb refuses before it reaches the network)."""
    pytest.importorskip("wandb")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(tmp_path), WANDB_SILENT="true", WANDB_CONFIG_DIR=str(tmp_path / "cfg"))
    run = subprocess.run(
        [sys.executable, "-m", "learner", "--port", "0", "--logdir", str(tmp_path / "run"),
         "--progress", "off", "--no-tensorboard", "--wandb", "--wandb-mode", "online"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert run.returncode == 2, run.stdout + run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith("python -m learner: error: --wandb: "), line
    assert "--wandb-mode offline" in line and "listening" not in run.stdout, run.stdout
