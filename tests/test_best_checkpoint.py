"""checkpoint-best.pt: the learner keeps the weights of its best mean-100 return beside the
latest checkpoint, and ``evaluate`` says which of the two it loaded."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from pathlib import Path

import pytest
import torch

from learner.checkpointing import BestKeeper
from learner.parts import Learner, build_learner, make_checkpointer, save_checkpoint
from learner.state import checkpoint
from learner.tools.evaluate import main as evaluate_main
from seedrl.config import LearnerConfig


def _config(logdir: Path, **kw: object) -> LearnerConfig:
    return LearnerConfig(logdir=str(logdir), tensorboard=False, progress="off", **kw)


def _window(learner: Learner, mean: float, episodes: int = 100) -> None:
    """The last ``episodes`` returns, all equal to ``mean``."""
    learner.stats.returns.clear()
    learner.stats.returns.extend([mean] * episodes)


def _policy_bias(learner: Learner) -> torch.Tensor:
    return learner.model.policy.bias.detach().clone()


def _saved_bias(path: Path) -> torch.Tensor:
    return checkpoint.load(path)["model"]["policy.bias"]


def _offer(learner: Learner, keeper: BestKeeper | None, final: bool = False) -> None:
    asyncio.run(make_checkpointer(learner, keeper=keeper).offer_best(final))


def test_the_best_checkpoint_holds_the_weights_of_the_best_mean_return(tmp_path):
    learner = build_learner(_config(tmp_path, best_checkpoint_interval_s=3600.0))
    keeper = BestKeeper.for_config(learner.config)
    best = learner.config.best_checkpoint_path

    _window(learner, 50.0, episodes=99)  # not a full window yet: nothing is the best
    _offer(learner, keeper)
    assert not best.exists()

    _window(learner, 50.0)
    learner.model.policy.bias.data.fill_(0.5)
    _offer(learner, keeper)
    assert checkpoint.load(best)[checkpoint.BEST_RETURN] == 50.0
    assert torch.equal(_saved_bias(best), _policy_bias(learner))
    assert not learner.config.checkpoint_path.exists(), "a best leaves checkpoint.pt alone"

    # Worse, then better within the interval: both leave the best as it was ...
    learner.model.policy.bias.data.fill_(-1.0)
    for mean in (30.0, 80.0):
        _window(learner, mean)
        _offer(learner, keeper)
        assert checkpoint.load(best)[checkpoint.BEST_RETURN] == 50.0
        assert torch.equal(_saved_bias(best), torch.full_like(_policy_bias(learner), 0.5))
    # ... and the end of the run does not wait for the interval.
    _offer(learner, keeper, final=True)
    assert checkpoint.load(best)[checkpoint.BEST_RETURN] == 80.0
    assert torch.equal(_saved_bias(best), _policy_bias(learner))
    # A run that ends below its best keeps the best.
    _window(learner, 60.0)
    _offer(learner, keeper, final=True)
    assert checkpoint.load(best)[checkpoint.BEST_RETURN] == 80.0

    # A resumed run goes on from that best; a fresh one in the same logdir starts over.
    resumed = BestKeeper.for_config(_config(tmp_path, resume=True))
    assert resumed is not None and resumed.best == 80.0
    fresh = BestKeeper.for_config(_config(tmp_path))
    assert fresh is not None and fresh.best == -math.inf
    assert BestKeeper.for_config(_config(tmp_path, best_checkpoint_interval_s=0)) is None


def test_a_keeper_off_writes_no_best(tmp_path):
    learner = build_learner(_config(tmp_path, best_checkpoint_interval_s=0))
    _window(learner, 50.0)
    _offer(learner, BestKeeper.for_config(learner.config), final=True)
    assert not learner.config.best_checkpoint_path.exists()


def test_evaluate_says_which_checkpoint_it_loaded(tmp_path, capsys):
    learner = build_learner(_config(tmp_path))
    learner.stats.frames = 4000
    _window(learner, 20.0)
    save_checkpoint(learner, best=None)
    learner.stats.frames = 2000
    _window(learner, 80.0)
    save_checkpoint(learner, best=80.0)

    assert evaluate_main(["--checkpoint", str(tmp_path), "--best", "--episodes", "1"]) == 0
    out = capsys.readouterr().out
    assert f"loaded {tmp_path / 'checkpoint-best.pt'}: the run's best, written at 2,000" in out
    assert "mean-100 return of 80.0" in out

    assert evaluate_main(["--checkpoint", str(tmp_path), "--episodes", "1"]) == 0
    out = capsys.readouterr().out
    assert f"loaded {tmp_path / 'checkpoint.pt'}: written at 4,000 frames" in out
    assert "mean-100 return 20.0" in out
    assert f"(the run's best, 80.0, is in {tmp_path / 'checkpoint-best.pt'}: --best)" in out

    with pytest.raises(SystemExit) as exit_info:
        evaluate_main(["--checkpoint", str(tmp_path / "checkpoint.pt"), "--best"])
    assert exit_info.value.code == 2
    assert "--best picks checkpoint-best.pt in a logdir" in capsys.readouterr().err


def test_the_first_and_best_full_windows_are_tracked_and_survive_a_resume(tmp_path):
    """What the collapse flag measures against: the first and the best mean of a full window
    of 100 episodes, reported as ``episode_return_best`` and kept by checkpoints."""
    learner = build_learner(_config(tmp_path))
    bests = []
    for mean, episodes in ((5.0, 99), (20.0, 100), (300.0, 100), (100.0, 100)):
        _window(learner, mean, episodes)
        bests.append(learner.stats.snapshot()["episode_return_best"])
    assert bests == [None, 20.0, 300.0, 300.0]
    save_checkpoint(learner)
    resumed = build_learner(_config(tmp_path, resume=True)).stats
    assert (resumed.return_first, resumed.return_best) == (20.0, 300.0)


def test_in_self_play_with_fixed_opponents_the_best_is_by_the_yardstick(tmp_path):
    """The return there is against a pool that strengthens with the learner; the score
    against the scripted players is what says one point of the run plays better."""
    pytest.importorskip("pettingzoo")
    from learner.league.pool import Outcome
    from learner.tools.evaluate import loaded_line

    config = _config(
        tmp_path, env="pettingzoo.classic.connect_four_v3", self_play=True,
        fixed_opponents=("heuristic", "random"), best_checkpoint_interval_s=3600.0,
    )  # fmt: skip
    learner = build_learner(config)
    assert learner.league is not None
    keeper = BestKeeper.for_config(config)
    assert keeper is not None and keeper.measure == checkpoint.BY_YARDSTICK
    best = config.best_checkpoint_path
    _window(learner, 1.0)  # a full window of returns makes no best here
    _offer(learner, keeper, final=True)
    assert not best.exists()
    for _ in range(50):  # the heuristic (-1): half won; random (-2): all won
        learner.league.record(-1, Outcome.WIN)
        learner.league.record(-1, Outcome.LOSS)
    for _ in range(100):
        learner.league.record(-2, Outcome.WIN)
    _offer(learner, keeper)
    assert checkpoint.load(best)[checkpoint.BEST_RETURN] == 0.5
    for _ in range(100):  # the return falls, the yardstick rises: a new best
        learner.league.record(-1, Outcome.WIN)
    _window(learner, -1.0)
    _offer(learner, keeper, final=True)
    saved = checkpoint.load(best)
    assert (saved[checkpoint.BEST_RETURN], saved[checkpoint.BEST_MEASURE]) == (
        1.0, checkpoint.BY_YARDSTICK,
    )  # fmt: skip
    info = checkpoint.CheckpointInfo.of(best, saved)
    assert f"with a {checkpoint.BY_YARDSTICK} of 100.0 %" in info.describe()
    save_checkpoint(learner)
    latest = checkpoint.CheckpointInfo.of(
        config.checkpoint_path, checkpoint.load(config.checkpoint_path)
    )
    assert f"(the run's best by its {checkpoint.BY_YARDSTICK}, 100.0 %, is in {best}" in (
        loaded_line(latest)
    )
    # A resumed run goes on from that best; one whose best is by another measure starts over.
    resumed = BestKeeper.for_config(dataclasses.replace(config, resume=True))
    assert resumed is not None and resumed.best == 1.0
    by_return = BestKeeper.for_config(_config(tmp_path, resume=True))
    assert by_return is not None and by_return.measure == checkpoint.BY_RETURN
    assert by_return.best == -math.inf
