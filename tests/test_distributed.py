"""Several learner ranks: torchrun + gloo on CPU, real actor processes, identical weights."""

from __future__ import annotations

import json
import socket
import sys

import pytest
import torch
from support import random_unrolls, read_records, running
from torch import distributed as dist

from learner.parts import build_learner
from learner.training.distributed import Control, RankEnv, RankHost, RankSync, rank_config
from seedrl.config import LearnerConfig
from seedrl.transport import learner_targets, pick_rank, rank_target


def free_port_pair() -> int:
    """A port p with p and p + 1 both free on loopback (rank 0 and rank 1)."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return int(port)
    raise RuntimeError("no two adjacent free ports")


def test_rank_env_from_torchrun_variables():
    assert RankEnv.from_environ({}) is None
    assert RankEnv.from_environ({"WORLD_SIZE": "1", "RANK": "0"}) is None
    env = RankEnv.from_environ({"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1"})
    assert env == RankEnv(rank=3, world_size=4, local_rank=1)
    assert not env.is_main


def test_rank_config_ports_logdirs_devices():
    base = LearnerConfig(port=9000, logdir="runs/x", device="auto", seed=5)
    r0 = rank_config(base, RankEnv(0, 2, 0))
    r1 = rank_config(base, RankEnv(1, 2, 1))
    assert (r0.port, r1.port) == (9000, 9001)
    assert r0.logdir == "runs/x" and r1.logdir.endswith("rank1")
    assert r0.seed != r1.seed
    assert r1.device in ("cpu", "cuda:1")
    assert r1.progress == "off"
    with pytest.raises(ValueError, match="fixed --port"):
        rank_config(LearnerConfig(port=0), RankEnv(0, 2, 0))


def test_cuda_ranks_take_the_gpu_of_their_local_rank(monkeypatch):
    """On a GPU host each rank gets cuda:LOCAL_RANK (not its global rank); cpu stays cpu."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    base = LearnerConfig(port=9000, device="auto")
    assert rank_config(base, RankEnv(rank=5, world_size=8, local_rank=1)).device == "cuda:1"
    cuda = LearnerConfig(port=9000, device="cuda")
    assert rank_config(cuda, RankEnv(rank=2, world_size=4, local_rank=2)).device == "cuda:2"
    cpu = LearnerConfig(port=9000, device="cpu")
    assert rank_config(cpu, RankEnv(rank=1, world_size=2, local_rank=1)).device == "cpu"


def test_cuda_ranks_join_over_nccl_on_their_own_device(monkeypatch):
    """The process group of CUDA ranks is NCCL, after the rank's device was made current."""
    calls: list[tuple[str, object]] = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("device", str(d))))
    monkeypatch.setattr(
        dist, "init_process_group", lambda backend, **kw: calls.append(("init", backend))
    )
    monkeypatch.setattr(dist, "new_group", lambda backend, **kw: calls.append(("group", backend)))

    def gather(out, obj, group=None):
        out[:] = [obj] * len(out)

    monkeypatch.setattr(dist, "all_gather_object", gather)
    config = LearnerConfig(port=9000, device="cuda:1", bind="127.0.0.1")
    sync = RankSync(RankEnv(rank=1, world_size=2, local_rank=1), config)
    assert calls == [("device", "cuda:1"), ("init", "nccl"), ("group", "gloo")]
    assert sync.device == torch.device("cuda:1")
    calls.clear()
    RankSync(RankEnv(rank=1, world_size=2, local_rank=1), LearnerConfig(port=9000, device="cpu"))
    assert calls == [("init", "gloo"), ("group", "gloo")]


def _sync_without_a_group(monkeypatch, tmp_path, **overrides: object) -> RankSync:
    """A rank whose process-group calls are stand-ins (nothing joins anything)."""
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: None)
    monkeypatch.setattr(dist, "new_group", lambda backend, **kw: None)

    def gather(out, obj, group=None):
        out[:] = [obj] * len(out)

    monkeypatch.setattr(dist, "all_gather_object", gather)
    config = LearnerConfig(
        port=9000, device="cpu", bind="127.0.0.1", logdir=str(tmp_path),
        **overrides,  # type: ignore[arg-type]
    )  # fmt: skip
    return RankSync(RankEnv(rank=0, world_size=2, local_rank=0), config)


@pytest.mark.parametrize("mode", ["auto", "thread"])
def test_ranks_train_in_a_lockstep_thread(monkeypatch, tmp_path, mode):
    sync = _sync_without_a_group(monkeypatch, tmp_path, trainer=mode)
    trainer = sync.make_host(build_learner(sync.config))
    assert isinstance(trainer, RankHost)
    assert trainer.sync is sync


@pytest.mark.parametrize("mode", ["process", "device"])
def test_ranks_refuse_another_trainer(monkeypatch, tmp_path, mode):
    sync = _sync_without_a_group(monkeypatch, tmp_path, trainer=mode)
    with pytest.raises(ValueError, match="torchrun ranks train in a thread"):
        sync.make_host(build_learner(sync.config))


def test_ranks_refuse_observation_normalization(monkeypatch, tmp_path):
    sync = _sync_without_a_group(monkeypatch, tmp_path, normalize_observations=True)
    with pytest.raises(ValueError, match="--normalize-observations is not supported"):
        sync.attach(build_learner(sync.config))


def test_a_rank_takes_updates_per_batch_lockstep_updates_and_stops_with_its_peers(
    monkeypatch, tmp_path
):
    """Each of the K updates on a batch is one exchange of the collectives (so ranks pair
    exchange by exchange); a rank without a batch joins one; a stop decided in any
    exchange ends the batch there on every rank."""
    sync = _sync_without_a_group(monkeypatch, tmp_path, updates_per_batch=3)
    learner = build_learner(sync.config)
    trainer = sync.make_host(learner)
    exchanges: list[bool] = []
    stop_at = {5}

    def exchange(has_batch: bool, stop_vote: bool, frames: int, episodes: int) -> Control:
        exchanges.append(has_batch)
        return Control(1, len(exchanges) in stop_at, frames, episodes)  # a peer has a batch

    monkeypatch.setattr(sync, "exchange_control", exchange)
    monkeypatch.setattr(sync, "average_gradients", lambda flat, contributed, count: None)
    measures: list[float] = []  # the step bound's measure (on by default), one per look

    def weighted_mean(value: float, weight: float) -> float:
        measures.append(weight)
        return value

    monkeypatch.setattr(sync, "weighted_mean", weighted_mean)
    unrolls = random_unrolls(2, sync.config.unroll_length, seed=0)
    assert trainer.lockstep_batch(unrolls) is False
    assert exchanges == [True] * 3 and learner.step_counter.value == 3
    assert learner.stats.learner_steps == 3
    assert len(measures) >= 3 and set(measures) == {1.0}
    looks = len(measures)
    assert trainer.lockstep_batch(None) is False  # no batch here: one exchange, the peer's update
    assert exchanges == [True] * 3 + [False] and learner.step_counter.value == 4
    assert measures[looks:] == [0.0]  # and it joins the peer's measure of that step, unweighted
    assert trainer.lockstep_batch(unrolls) is True  # stop decided in its first exchange
    assert exchanges == [True] * 3 + [False, True] and learner.step_counter.value == 5


def test_actor_picks_rank_by_index():
    ranks = ["0.0.0.0:9000", "0.0.0.0:9001"]
    assert pick_rank(ranks, 0, "learner.svc:9000") == "learner.svc:9000"
    assert pick_rank(ranks, 3, "learner.svc:9000") == "learner.svc:9001"
    assert pick_rank([], 3, "h:1") == "h:1"
    assert pick_rank(["10.0.0.2:9000", "10.0.0.3:9000"], 1, "10.0.0.2:9000") == "10.0.0.3:9000"
    assert rank_target("[::]:9001", "[fd00::1]:9000") == "[fd00::1]:9001"
    assert learner_targets("a:1, b:2,") == ["a:1", "b:2"]


@pytest.mark.long
@pytest.mark.parametrize(
    "bound",
    [[], ["--max-update-kl", "1e-7"], ["--serving-processes", "1"]],
    ids=["free", "bounded", "serving frontends"],
)
def test_two_ranks_train_in_lockstep(tmp_path, bound):
    """2 gloo ranks, 3 actors (2 find their rank via GetInfo, 1 is given a list). With a
    step bound that bites every step, the ranks must still agree on how far each step
    went (their batches, and so their own measures, differ) or their weights part. With
    a serving frontend per rank, each rank's frontend offers the ranks in GetInfo."""
    port = free_port_pair()
    learner = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "-m", "learner", "--port", str(port), "--logdir", str(tmp_path), "--total-frames", "8000",
        "--batch-size", "8", "--unroll-length", "10", "--max-seconds", "90",
        "--progress", "plain", "--log-interval-s", "1", "--no-tensorboard", *bound,
    ]  # fmt: skip
    by_discovery = [
        sys.executable, "-m", "actors", "--learner", f"127.0.0.1:{port}",
        "--num-actors", "2", "--envs-per-actor", "4",
    ]  # fmt: skip
    by_list = [
        sys.executable, "-m", "actors", "--learner", f"127.0.0.1:{port + 1},127.0.0.1:{port}",
        "--num-actors", "1", "--envs-per-actor", "4", "--first-index", "2",
    ]  # fmt: skip
    with running(learner, {"OMP_NUM_THREADS": "1"}) as ranks:
        for _ in range(2):
            ranks.wait_for("listening on", 90)
        with running(by_discovery), running(by_list):
            assert ranks.wait(timeout=120) == 0, ranks.output()
    assert "parameters identical: True" in ranks.output()
    if "--serving-processes" in bound:
        assert ranks.output().count("serving by 1 frontend") == 2, ranks.output()
    summary = json.loads((tmp_path / "ranks.json").read_text())
    assert summary["world_size"] == 2
    assert summary["params_identical"], summary
    results = [
        json.loads((tmp_path / "result.json").read_text()),
        json.loads((tmp_path / "rank1" / "result.json").read_text()),
    ]
    assert summary["frames_all_ranks"] == sum(r["frames"] for r in results)
    assert summary["frames_all_ranks"] >= 8000
    assert all(r["frames"] > 0 for r in results), results
    steps = {r["learner_steps"] for r in results}
    assert len(steps) == 1 and steps.pop() > 0, results
    for logdir in (tmp_path, tmp_path / "rank1"):
        records = read_records(logdir)
        assert max(r["actors_connected"] for r in records) >= 1, logdir
        assert records[-1]["world_size"] == 2
        if "--max-update-kl" in bound:
            kept = [r["update_kept"] for r in records if "update_kept" in r]
            assert kept and min(kept) < 1.0, logdir
    # Rank 1 got actor 1 (by discovery) and actor 2 (by list): two streams at once.
    assert max(r["actors_connected"] for r in read_records(tmp_path / "rank1")) == 2
    assert not (tmp_path / "rank1" / "checkpoint.pt").exists(), "only rank 0 checkpoints"
    assert (tmp_path / "checkpoint.pt").exists()


def test_identical_replicas_pick_a_random_first_index(monkeypatch):
    """--first-index -1 (compose/k8s replicas): distinct seeds, spread over ranks."""
    from actors.launcher import Launcher
    from seedrl.config import ActorConfig

    spawned: list[int] = []
    monkeypatch.setattr(Launcher, "_spawn", lambda self, index: spawned.append(index))
    Launcher(ActorConfig(num_actors=3, first_index=-1)).start()
    assert spawned[0] >= 0 and spawned == list(range(spawned[0], spawned[0] + 3))
    spawned.clear()
    Launcher(ActorConfig(num_actors=2, first_index=5)).start()
    assert spawned == [5, 6]
