"""When a running learner writes which checkpoint, on a clock the test moves: the
periodic checkpoint.pt, the replay on its own longer interval, checkpoint-best.pt on
its interval, the final ones at the run's end, and nothing from a rank that does not
write. The checkpointer is built from fakes, so no model or trainer is involved."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from learner.checkpointing import BestKeeper, Checkpointer
from learner.state import checkpoint
from learner.state.files import Lease
from learner.state.stats import RETURN_WINDOW, LearnerStats
from seedrl.config import LearnerConfig
from seedrl.proto import seedrl_pb2 as pb


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeStore:
    """A replay that notes when it was asked to save (it keeps nothing, so writes no file)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.saved_at: list[float] = []

    def save(self, path: Path, lease: Lease | None = None) -> int:
        self.saved_at.append(self.clock())
        return 0


def _training() -> checkpoint.TrainingState:
    return checkpoint.TrainingState(model={}, optimizer={}, learner_steps=0)


def _checkpointer(
    tmp_path: Path, clock: FakeClock, **kw: Any
) -> tuple[Checkpointer, LearnerStats, FakeStore]:
    config = LearnerConfig(
        logdir=str(tmp_path), tensorboard=False, progress="off", checkpoint_interval_s=10.0,
        replay_checkpoint_interval_s=25.0, best_checkpoint_interval_s=20.0,
    )  # fmt: skip
    stats, store = LearnerStats(), FakeStore(clock)
    keeper = BestKeeper.for_config(config, clock)
    checkpointer = Checkpointer(
        config, _training, stats, pb.EnvSpec(env_id="Fake-v0"), {}, store,
        keeper=keeper, clock=clock, start=0.0, **kw,
    )  # fmt: skip
    return checkpointer, stats, store


def _frames(path: Path) -> int | None:
    return int(checkpoint.load(path)["frames"]) if path.is_file() else None


def test_the_periodic_the_replay_and_the_best_checkpoint_each_keep_their_interval(tmp_path):
    clock = FakeClock()
    checkpointer, stats, store = _checkpointer(tmp_path, clock)
    config = checkpointer.config
    periodic, best = [], []
    for t in range(0, 65, 5):
        clock.now = float(t)
        stats.frames = t  # each checkpoint says when it was written
        stats.returns.extend([float(t)] * RETURN_WINDOW)  # a new best at every pass
        asyncio.run(checkpointer.tick())
        if _frames(config.checkpoint_path) == t:
            periodic.append(t)
        if _frames(config.best_checkpoint_path) == t:
            best.append(t)
    assert periodic == [10, 20, 30, 40, 50, 60]
    assert store.saved_at == [30.0, 60.0]  # the first periodic 25 s after the last replay
    assert best == [0, 20, 40, 60]


def test_the_runs_end_writes_both_whatever_the_intervals_and_records_the_ranks_counters(
    tmp_path,
):
    clock = FakeClock()
    checkpointer, stats, _ = _checkpointer(tmp_path, clock, counters=lambda: (1000, 7))
    config = checkpointer.config
    stats.returns.extend([1.0] * RETURN_WINDOW)
    clock.now = 1.0
    asyncio.run(checkpointer.tick())  # the best, first of its kind; checkpoint.pt not yet due
    assert not config.checkpoint_path.exists()
    stats.returns.extend([2.0] * RETURN_WINDOW)
    assert asyncio.run(checkpointer.final()) == []
    latest = checkpoint.load(config.checkpoint_path)
    kept = checkpoint.load(config.best_checkpoint_path)
    assert (latest["frames"], latest["episodes"]) == (1000, 7)
    assert kept[checkpoint.BEST_RETURN] == 2.0  # within its interval, but the run ends


def test_a_rank_that_does_not_write_writes_nothing_and_a_dead_trainer_is_a_failure(tmp_path):
    clock = FakeClock()
    quiet, stats, store = _checkpointer(tmp_path / "quiet", clock, writes=False)
    stats.returns.extend([1.0] * RETURN_WINDOW)
    for t in (0.0, 30.0, 60.0):
        clock.now = t
        asyncio.run(quiet.tick())
    assert asyncio.run(quiet.final()) == []
    assert not (tmp_path / "quiet").exists() and store.saved_at == []

    dead, stats, _ = _checkpointer(tmp_path / "dead", clock)
    dead.capture = lambda: None
    stats.returns.extend([1.0] * RETURN_WINDOW)
    assert asyncio.run(dead.final()) == [
        "final checkpoint checkpoint.pt: the trainer process died",
        "checkpoint-best.pt: the trainer process died",
    ]
