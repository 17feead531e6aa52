"""Faults a long run must survive, on real processes over loopback.

Actor churn by SIGKILL; learner SIGKILL and ``--resume`` with the same actor processes;
graceful SIGINT with health NOT_SERVING; a stuck and a slow actor beside fast ones;
more actors than ``--max-actors``. Checkpoint corruption and the trainer's non-finite
guard are tested in-process, where the failure can be placed exactly.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import signal
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support import actor_args, free_port, learner_args, read_records, running, wait_until
from wire_clients import HeldStream, LockstepClient, act, child_pids, get_info, hello, lockstep

from learner.__main__ import main as learner_main
from learner.parts import build_learner, make_trainer, save_checkpoint
from learner.state import checkpoint, files
from learner.state.trajectories import Unrolls
from seedrl.config import LearnerConfig

UNROLL = 20  # the default --unroll-length
INFO = {"SEEDRL_LOG_LEVEL": "INFO"}


def last(logdir: Path, key: str, default: float = 0) -> float:
    records = read_records(logdir)
    return records[-1].get(key, default) if records else default


def no_errors(output: str) -> bool:
    return "Traceback" not in output and " ERROR " not in output


# ------------------------------------------------------------------ actor churn


@pytest.mark.long
def test_actor_churn_sigkill(tmp_path):
    """Kill a random actor about every second for 12 s; the launcher restarts them."""
    actors_n, envs = 4, 4
    port = free_port()
    with running(learner_args(port, tmp_path), env=INFO) as learner:
        learner.wait_for("listening on", 60)
        launcher_args = actor_args(port, actors_n, envs, "--max-backoff-s", "1")
        with running(launcher_args, env=INFO) as launcher:
            wait_until(lambda: last(tmp_path, "actors_connected") == actors_n, 60, what="actors")
            wait_until(lambda: last(tmp_path, "learner_steps") > 0, 60, what="training")
            steps_before = last(tmp_path, "learner_steps")
            rng = random.Random(7)
            kills = 0
            end = time.monotonic() + 12
            while time.monotonic() < end:
                time.sleep(rng.uniform(0.5, 1.5))
                pids = child_pids(launcher.popen.pid)
                if pids:
                    os.kill(rng.choice(pids), signal.SIGKILL)
                    kills += 1
            assert kills >= 6
            # The launcher brings every actor back and the learner sees exactly them.
            wait_until(
                lambda: (
                    len(child_pids(launcher.popen.pid)) == actors_n
                    and last(tmp_path, "actors_connected") == actors_n
                ),
                60,
                what="all actors back",
            )
            wait_until(
                lambda: last(tmp_path, "learner_steps") > steps_before + 5, 60, what="training"
            )
            dropped = last(tmp_path, "frames_dropped")
            print(f"churn: {kills} kills, {dropped} frames dropped of {last(tmp_path, 'frames')}")
            # Each killed actor loses at most its K partial unrolls (< T+1 frames each).
            assert 0 < dropped <= kills * envs * (UNROLL + 1), (dropped, kills)
            assert all(r["actors_connected"] <= actors_n for r in read_records(tmp_path))
            # SIGKILL every actor at once: the learner notices the dead streams promptly.
            launcher.kill_group()
            wait_until(lambda: last(tmp_path, "actors_connected") == 0, 20, what="streams gone")
        output = learner.output()
        assert learner.popen.poll() is None, output
        connects = sum("connected from" in line for line in learner.lines)
        disconnects = sum("disconnected after" in line for line in learner.lines)
        # Every stream that came also went; kills of actors still starting up cost nothing.
        assert connects == disconnects > actors_n, (connects, disconnects, kills)
        assert no_errors(output), output
        learner.signal(signal.SIGTERM)
        assert learner.wait(30) == 0, learner.output()


# ------------------------------------------------------------------ learner death


def _health_watch(port: int, statuses: list[int]) -> threading.Thread:
    def watch() -> None:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            try:
                for reply in stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=60):
                    statuses.append(reply.status)
            except grpc.RpcError:
                pass  # the server went away: the watch is over

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.long
def test_learner_sigkill_resume_same_actors_then_sigint(tmp_path):
    """SIGKILL the learner; --resume on the same logdir/port; the same actors come back."""
    port = free_port()
    base = learner_args(port, tmp_path, "--checkpoint-interval-s", "1", "--seed", "3")
    actors_cmd = actor_args(port, 2, 4, "--max-backoff-s", "1", "--exit-on-shutdown")
    with running(base, env=INFO) as first, running(actors_cmd, env=INFO) as launcher:
        first.wait_for("listening on", 60)
        wait_until(lambda: last(tmp_path, "learner_steps") >= 5, 90, what="training")
        ckpt = tmp_path / "checkpoint.pt"
        mtime = ckpt.stat().st_mtime_ns if ckpt.exists() else 0
        wait_until(lambda: ckpt.exists() and ckpt.stat().st_mtime_ns != mtime, 30, what="ckpt")
        actor_pids = child_pids(launcher.popen.pid)
        assert len(actor_pids) == 2
        first.kill_group()  # SIGKILL: no final checkpoint, no Shutdown to the actors
        first.wait(10)
        saved = checkpoint.load(ckpt)
        records_before = len(read_records(tmp_path))
        assert saved["learner_steps"] > 0 and saved["frames"] > 0

        with running([*base, "--resume"], env=INFO) as second:
            line = second.wait_for("resumed from", 60)
            assert f"at frame {saved['frames']}, step {saved['learner_steps']}" in line
            wait_until(
                lambda: (
                    len(read_records(tmp_path)) > records_before
                    and last(tmp_path, "actors_connected") == 2
                    and last(tmp_path, "learner_steps") > saved["learner_steps"] + 3
                ),
                90,
                what="actors back and training after resume",
            )
            resumed = read_records(tmp_path)[records_before:]
            first_after = (resumed[0]["frames"], resumed[0]["learner_steps"])
            print(f"resume: checkpoint {saved['frames']}/{saved['learner_steps']} (frames/steps),")
            print(f"        first record after the restart {first_after}")
            assert resumed[0]["frames"] >= saved["frames"]
            assert resumed[0]["learner_steps"] >= saved["learner_steps"]
            assert resumed[-1]["frames"] > saved["frames"]
            # The very same actor processes reconnected by themselves.
            assert child_pids(launcher.popen.pid) == actor_pids
            assert "exited with" not in launcher.output()

            # Graceful stop by SIGINT: health flips to NOT_SERVING, final checkpoint,
            # actors are told (and exit 0 because of --exit-on-shutdown), exit 0.
            statuses: list[int] = []
            watcher = _health_watch(port, statuses)
            wait_until(lambda: statuses, 10, what="health watch")
            assert statuses[0] == health_pb2.HealthCheckResponse.SERVING
            second.signal(signal.SIGINT)
            assert second.wait(30) == 0, second.output()
            watcher.join(10)
            assert health_pb2.HealthCheckResponse.NOT_SERVING in statuses, statuses
            assert launcher.wait(30) == 0, launcher.output()
            assert no_errors(second.output()), second.output()
    final = checkpoint.load(ckpt)
    assert final["frames"] >= resumed[-1]["frames"]
    assert final["learner_steps"] >= resumed[-1]["learner_steps"]
    # Frames stopped before the final checkpoint: it holds everything the run counted.
    result = json.loads((tmp_path / "result.json").read_text())
    assert (final["frames"], final["learner_steps"]) == (result["frames"], result["learner_steps"])


# ------------------------------------------------------------------ stuck, slow, overload


@pytest.mark.long
def test_stuck_slow_hung_actors_and_overload(tmp_path):
    """A silent stream, a slow one and a SIGSTOPped one never stall the others; overload is
    refused with RESOURCE_EXHAUSTED until a place frees."""
    max_actors = 4
    # --stream-idle-timeout-s 0: the held stream stays until the test frees it.
    flags = ["--max-actors", str(max_actors), "--stream-idle-timeout-s", "0"]
    with running(learner_args(port := free_port(), tmp_path, *flags), env=INFO) as learner:
        learner.wait_for("listening on", 60)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            env = get_info(channel).env
            held = HeldStream(channel, env)  # admitted, then silent (no idle bound here)
            slow = LockstepClient(channel, env, pause_s=2.0).start()  # seconds between frames
            try:
                with running(actor_args(port, 1, 4), env=INFO) as real:  # full speed
                    with lockstep(channel, env) as good:
                        wait_until(
                            lambda: last(tmp_path, "actors_connected") == max_actors, 60, what="4"
                        )
                        # The held stream never sends and the slow one pauses for seconds,
                        # yet the others are served (batches close on their deadline).
                        good.wait_for_more(200)
                        frames = last(tmp_path, "frames")
                        wait_until(lambda: last(tmp_path, "frames") > frames + 500, 30, what="fps")
                        slow.wait_for_more(1)  # and the slow one is served when it does send

                        # Overload: the learner is full; one more stream is refused clearly.
                        outcome = act(channel, [hello(env, 2)])
                        assert outcome.code == grpc.StatusCode.RESOURCE_EXHAUSTED, outcome
                        assert f"--max-actors {max_actors}; retry later" in outcome.details
                        # A real actor that does not fit keeps retrying ...
                        extra = actor_args(port, 1, 2, "--max-backoff-s", "0.5")
                        with running(extra, env=INFO) as late:
                            late.wait_for("RESOURCE_EXHAUSTED: learner is full", 60)
                            good.wait_for_more(50)  # the admitted ones are unaffected
                            held.close()  # ... and gets in once a slot frees
                            wait_until(
                                lambda: sum("connected from" in x for x in learner.lines) >= 5,
                                30,
                                what="late actor admitted",
                            )
                            wait_until(
                                lambda: last(tmp_path, "streams_rejected") >= 2, 20, what="count"
                            )
                            good.wait_for_more(50)
                            assert last(tmp_path, "actors_connected") <= max_actors

                            # A hung actor host (no FIN, no RST: SIGSTOP) is dropped by the
                            # keepalive ping timeout, freeing its place; once it runs again
                            # it notices its dead stream and reconnects.
                            hung = child_pids(real.popen.pid)[0]
                            os.kill(hung, signal.SIGSTOP)
                            try:
                                wait_until(
                                    lambda: last(tmp_path, "actors_connected") == max_actors - 1,
                                    40,
                                    what="hung actor dropped",
                                )
                                good.wait_for_more(50)
                            finally:
                                os.kill(hung, signal.SIGCONT)
                            wait_until(
                                lambda: last(tmp_path, "actors_connected") == max_actors,
                                40,
                                what="hung actor back",
                            )
            finally:
                held.close()
                slow.stop()
        assert learner.popen.poll() is None
        assert no_errors(learner.output()), learner.output()


# ------------------------------------------------------------------ checkpoints


def _small_config(tmp_path: Path, **kw: object) -> LearnerConfig:
    return LearnerConfig(logdir=str(tmp_path), tensorboard=False, progress="off", **kw)


def test_crash_mid_checkpoint_write_keeps_previous(tmp_path, monkeypatch):
    learner = build_learner(_small_config(tmp_path))
    learner.stats.frames = 1234
    save_checkpoint(learner)
    path = learner.config.checkpoint_path
    learner.stats.frames = 9999

    def killed_mid_write(fd: int) -> None:
        raise KeyboardInterrupt("simulated kill during fsync")

    monkeypatch.setattr(os, "fsync", killed_mid_write)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(learner)
    monkeypatch.undo()
    assert checkpoint.load(path)["frames"] == 1234
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]

    # A writer SIGKILLed mid-write leaves a torn temp file: ignored, then cleaned up once
    # it is old enough that no writer can be between creating and locking it.
    torn = tmp_path / ".checkpoint.pt.tmp-99999"
    torn.write_bytes(path.read_bytes()[:100])
    assert checkpoint.load(path)["frames"] == 1234
    save_checkpoint(learner)
    assert checkpoint.load(path)["frames"] == 9999
    assert torn.exists()
    old = time.time() - 2 * files.STALE_TEMP_S
    os.utime(torn, (old, old))
    save_checkpoint(learner)
    assert not torn.exists()


def test_two_writers_in_one_process_never_share_a_temp_file(tmp_path):
    """Two learners on one volume can both be pid 1: a temp name made of the pid was one
    file for both, and their writes interleaved into one torn checkpoint."""
    target = tmp_path / "checkpoint.pt"
    first, second = files.atomic_file(target), files.atomic_file(target)
    a = first.__enter__()
    a.write(b"a" * 500)
    b = second.__enter__()
    b.write(b"b" * 1000)
    a.write(b"a" * 500)
    second.__exit__(None, None, None)
    assert target.read_bytes() == b"b" * 1000
    first.__exit__(None, None, None)
    assert target.read_bytes() == b"a" * 1000
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_a_writers_sweep_leaves_a_live_writers_temp_file_alone(tmp_path):
    """The sweep removes only temp files no live writer holds, however old they look (a
    slow replay write, a clock stepped back)."""
    target = tmp_path / "checkpoint.pt"
    slow = files.atomic_file(target)
    f = slow.__enter__()
    f.write(b"slow" * 250)
    (live,) = tmp_path.glob(".checkpoint.pt.tmp-*")
    old = time.time() - 2 * files.STALE_TEMP_S
    os.utime(live, (old, old))
    with files.atomic_file(target) as fast:
        fast.write(b"fast")
    assert target.read_bytes() == b"fast" and live.exists()
    assert files.sweep_stale_temps(target) == []
    slow.__exit__(None, None, None)
    assert target.read_bytes() == b"slow" * 250
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_the_first_checkpoint_past_each_history_mark_is_kept_for_good(tmp_path):
    """--checkpoint-history-frames: the latest checkpoint moves on, and the first one past
    each multiple stays as it was written (a later save replaces checkpoint.pt, not it)."""
    learner = build_learner(_small_config(tmp_path, checkpoint_history_frames=1000))
    kept = {}
    for frames in (400, 1234, 1500, 2100, 2600):
        learner.stats.frames = frames
        save_checkpoint(learner)
        kept = {p.name: checkpoint.load(p)["frames"] for p in (tmp_path / "checkpoints").glob("*")}
    assert kept == {"frames-0.pt": 400, "frames-1000.pt": 1234, "frames-2000.pt": 2100}
    assert checkpoint.load(learner.config.checkpoint_path)["frames"] == 2600
    off = tmp_path / "off"
    save_checkpoint(build_learner(_small_config(off)))
    assert sorted(p.name for p in off.iterdir()) == ["checkpoint.pt"]
    with pytest.raises(ValueError, match="--checkpoint-history-frames must be >= 0"):
        _small_config(tmp_path, checkpoint_history_frames=-1)


def _write_checkpoint_for(tmp_path: Path, **kw: object) -> None:
    save_checkpoint(build_learner(_small_config(tmp_path, **kw)))


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("garbage", "not a readable checkpoint"),
        ("text", "not a readable checkpoint"),
        ("truncated", "not a readable checkpoint"),
        ("foreign", "not a seedrl checkpoint"),
        ("future", "checkpoint version 99"),
        ("other env", "trained on env 'Acrobot-v1'"),
        ("other model", "does not fit this model/config"),
    ],
)
def test_bad_checkpoint_is_a_clear_error(tmp_path, capsys, case, words):
    path = tmp_path / "checkpoint.pt"
    if case == "garbage":
        path.write_bytes(os.urandom(4096))
    elif case == "text":  # torch's unpickling error for it is many lines long
        path.write_bytes(b"not a checkpoint")
    elif case == "truncated":
        _write_checkpoint_for(tmp_path)
        path.write_bytes(path.read_bytes()[:-200])
    elif case == "foreign":
        torch.save({"weights": torch.zeros(3)}, path)
    elif case == "future":
        _write_checkpoint_for(tmp_path)
        state = torch.load(path, weights_only=True)
        torch.save({**state, "version": 99}, path)
    elif case == "other env":
        _write_checkpoint_for(tmp_path, env="Acrobot-v1")
    else:
        _write_checkpoint_for(tmp_path, hidden_sizes=(16,))
    capsys.readouterr()
    code = learner_main(["--logdir", str(tmp_path), "--resume", "--port", "0", "--progress", "off"])
    err = capsys.readouterr().err
    assert code == 2
    assert str(path) in err and words in err, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "metrics.jsonl").exists(), "nothing may start on a bad checkpoint"


def _corrupt(path: Path, how: str) -> None:
    """Damage ``path`` as a new file: in place it would damage a history checkpoint
    hard-linked to it too."""
    data = path.read_bytes()
    path.unlink()
    path.write_bytes(os.urandom(4096) if how == "random" else data[: len(data) // 2])


@pytest.mark.parametrize("how", ["random", "truncated"])
def test_resume_falls_back_past_a_corrupt_checkpoint_to_the_newest_readable(tmp_path, caplog, how):
    """A corrupt checkpoint.pt beside readable ones was exit 2 on every --resume: under
    restart: on-failure, a crash loop. It goes on from the newest that loads, and says
    which it skipped."""
    config = _small_config(tmp_path, checkpoint_history_frames=1000)
    learner = build_learner(config)
    for frames in (500, 1500, 2500, 2600):
        learner.stats.frames = frames
        save_checkpoint(learner)
    save_checkpoint(learner, best=1.0)
    newest = tmp_path / "checkpoints" / "frames-2000.pt"
    _corrupt(config.checkpoint_path, how)
    _corrupt(newest, how)
    resumed = build_learner(dataclasses.replace(config, resume=True))
    assert resumed.stats.frames == 1500
    warning = caplog.text
    assert "resuming from" in warning and "frames-1000.pt" in warning
    assert f"{config.checkpoint_path}: not a readable checkpoint" in warning
    assert f"{newest}: not a readable checkpoint" in warning
    # History gone too: the best checkpoint; nothing readable: the one-line exit 2.
    for kept in (tmp_path / "checkpoints").iterdir():
        _corrupt(kept, how)
    assert build_learner(dataclasses.replace(config, resume=True)).stats.frames == 2600
    _corrupt(config.best_checkpoint_path, how)
    code = learner_main(["--logdir", str(tmp_path), "--resume", "--port", "0", "--progress", "off"])
    assert code == 2


def test_resume_from_nothing_readable_is_one_line_naming_checkpoint_pt(tmp_path, capsys):
    config = _small_config(tmp_path, checkpoint_history_frames=1000)
    save_checkpoint(build_learner(config))
    save_checkpoint(build_learner(config), best=1.0)
    for path in (config.checkpoint_path, config.best_checkpoint_path, *tmp_path.glob("*/*.pt")):
        _corrupt(path, "random")
    capsys.readouterr()
    code = learner_main(["--logdir", str(tmp_path), "--resume", "--port", "0", "--progress", "off"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: {config.checkpoint_path}: not a readable checkpoint"), err
    assert "none of the 2 other checkpoints beside it loads either" in err
    assert not (tmp_path / "metrics.jsonl").exists()


def test_a_checkpoint_that_does_not_fit_is_no_reason_to_fall_back(tmp_path, capsys):
    """Another env or model is the command's mistake, not damage: an older checkpoint
    that happens to fit would quietly undo the change."""
    config = _small_config(tmp_path, checkpoint_history_frames=1000)
    save_checkpoint(build_learner(config))
    save_checkpoint(build_learner(dataclasses.replace(config, hidden_sizes=(16,))))
    with pytest.raises(checkpoint.CheckpointError, match="does not fit this model"):
        build_learner(dataclasses.replace(config, resume=True))


def test_resume_restores_weights_optimizer_counters_and_rng(tmp_path):
    config = _small_config(tmp_path)
    learner = build_learner(config)
    trainer = make_trainer(learner)
    assert trainer.train_step(_unrolls(4, 4)) is not None
    learner.stats.frames, learner.stats.episodes = 5000, 7
    learner.stats.returns.extend([10.0, 20.0])
    save_checkpoint(learner)
    next_draw = torch.rand(8)  # what sampling would have drawn next

    # A new rate and epsilon on the command line win over the checkpoint's saved ones.
    changed = dataclasses.replace(config, resume=True, seed=99, learning_rate=0.0123, adam_eps=1e-3)
    resumed = build_learner(changed)
    assert torch.equal(torch.rand(8), next_draw), "torch RNG state must be restored"
    assert resumed.step_counter.value == 1
    assert (resumed.stats.frames, resumed.stats.episodes) == (5000, 7)
    assert resumed.stats.return_mean == 15.0
    for a, b in zip(_weights(learner.model), _weights(resumed.model), strict=True):
        assert torch.equal(a, b)
    saved_opt, loaded_opt = learner.optimizer.state_dict(), resumed.optimizer.state_dict()
    for group in loaded_opt["param_groups"]:
        assert (group["lr"], group["eps"]) == (0.0123, 1e-3)
    assert saved_opt["state"], "the checkpoint must carry Adam's moments"
    for key, state in saved_opt["state"].items():
        for name, value in state.items():
            assert torch.equal(value, loaded_opt["state"][key][name]), name


# ------------------------------------------------------------------ the trainer's guard


def _unrolls(n: int, obs_dim: int, fill: float = 0.01, reward: float = 1.0) -> Unrolls:
    rows = UNROLL + 1
    rng = np.random.default_rng(0)
    first = np.zeros((n, rows), np.bool_)
    first[:, 0] = True
    discount = LearnerConfig().discount  # the sums a learner normalising returns reads
    with np.errstate(over="ignore", invalid="ignore"):  # a poisoned reward poisons its sums
        running = reward * (1 - discount ** np.arange(1, rows + 1)) / (1 - discount)
    return Unrolls(
        obs=np.full((n, rows, obs_dim), fill, np.float32)
        + rng.normal(0, 0.01, (n, rows, obs_dim)).astype(np.float32),
        first=first,
        reward=np.full((n, rows), reward, np.float32),
        terminated=np.zeros((n, rows), np.bool_),
        truncated=np.zeros((n, rows), np.bool_),
        action=rng.integers(0, 2, (n, rows)).astype(np.int64),
        policy_params=np.zeros((n, rows, 2), np.float32),
        core_state=(),
        acted_step=np.zeros((n, rows), np.int64),
        running_return=np.tile(running, (n, 1)).astype(np.float32),
    )


def _weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


# The bad batches are meant to overflow and poison the arithmetic; numpy saying so is expected.
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_non_finite_never_reaches_the_optimizer(tmp_path):
    config = _small_config(tmp_path)
    learner = build_learner(config)
    trainer = make_trainer(learner)
    before = _weights(learner.model)
    bad_batches = [
        _unrolls(4, 4, fill=float("nan")),  # NaN observations (bypassing the wire checks)
        _unrolls(4, 4, fill=float("inf")),
        _unrolls(4, 4, reward=float("nan")),
        _unrolls(4, 4, reward=3e38),  # finite but the squared value error overflows
    ]
    for i, unrolls in enumerate(bad_batches, start=1):
        assert trainer.train_step(unrolls) is None
        assert learner.stats.nonfinite_skipped == i
        assert all(torch.equal(a, b) for a, b in zip(before, _weights(learner.model), strict=True))
        assert learner.step_counter.value == 0
        assert not learner.optimizer.state, "Adam moments must not see the bad step"
    scalars = trainer.train_step(_unrolls(4, 4))
    assert scalars is not None and np.isfinite(scalars["loss_total"])
    assert learner.step_counter.value == 1
    assert not all(torch.equal(a, b) for a, b in zip(before, _weights(learner.model), strict=True))
    assert all(torch.isfinite(p).all() for p in learner.model.parameters())


def test_a_status_its_gone_actor_cannot_get_is_no_traceback(caplog):
    """grpc logs a handler's final status that found the transport closed (the actor
    exited on its Shutdown) as an unexpected servicer error with a traceback; the
    learner's server drops exactly that record and keeps every other one."""
    from grpc._cython import cygrpc

    from learner.serving import server

    server._quiet_unsendable_status()
    grpc_log = logging.getLogger(cygrpc.__name__)

    def log_unexpected(exc: Exception) -> None:
        try:
            raise exc
        except Exception:
            grpc_log.exception("Unexpected [%s] raised by servicer method [/x/Act]", type(exc))

    with caplog.at_level(logging.DEBUG):
        log_unexpected(
            cygrpc.ExecuteBatchError('Failed "execute_batch": (<SendStatusFromServerOperation>,)')
        )
        log_unexpected(
            cygrpc.ExecuteBatchError('Failed "execute_batch": (<ReceiveMessageOperation>,)')
        )
        log_unexpected(ValueError("a servicer bug"))
    errors = [r for r in caplog.records if r.name == cygrpc.__name__]
    assert [type(r.exc_info[1]) for r in errors] == [cygrpc.ExecuteBatchError, ValueError]
    assert "ReceiveMessage" in str(errors[0].exc_info[1])
