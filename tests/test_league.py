"""The league glue: the pool and the Elo table kept in step, its metrics, its checkpoint
round trip, the ratings plot, and a league of players of known rising strength whose
snapshot ratings must rise with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks.league_sim import rank_correlation, run_league
from learner.league.league import League
from learner.league.plot import plot_ratings, rating_history
from learner.league.pool import Outcome, PoolConfig
from learner.metrics import tensorboard_tag


def tensor_weights(value: float) -> dict[str, torch.Tensor]:
    return {"w": torch.tensor([value])}


def test_snapshots_are_rated_as_the_learner_was_and_games_move_both() -> None:
    league = League(PoolConfig(snapshot_every=10, pool_size=2), seed=0, elo_k=16.0)
    assert league.on_step(0, tensor_weights(0)) == 0
    league.record(0, Outcome.WIN)  # equal ratings: +16 * 0.5 = +8
    assert league.ratings.table() == {"learner": 1008.0, "snapshot-0": 992.0}
    assert league.on_step(5, tensor_weights(5)) is None
    assert league.on_step(10, tensor_weights(10)) == 1
    assert league.ratings.rating("snapshot-1") == 1008.0  # born at the learner's rating
    assert league.pool.results()[0] == (1, 0, 0)
    league.on_step(20, tensor_weights(20))  # pool of 2: snapshot 0 leaves, and its rating
    assert set(league.ratings.table()) == {"learner", "snapshot-1", "snapshot-2"}
    league.record(0, Outcome.LOSS)  # a game begun before the eviction moves no rating
    assert league.ratings.rating("learner") == 1008.0


def test_metrics_hand_computed() -> None:
    league = League(PoolConfig(snapshot_every=1, pool_size=5), seed=0)
    league.on_step(0, tensor_weights(0))
    league.on_step(1, tensor_weights(1))
    for outcome in (Outcome.WIN, Outcome.WIN, Outcome.DRAW, Outcome.LOSS):
        league.record(0, outcome)
    metrics = league.metrics()
    assert metrics["selfplay_win_rate"] == 0.5
    assert metrics["selfplay_draw_rate"] == 0.25 and metrics["selfplay_loss_rate"] == 0.25
    assert (metrics["vs_snapshot_0_wins"], metrics["vs_snapshot_0_draws"]) == (2.0, 1.0)
    assert metrics["vs_snapshot_0_losses"] == 1.0 and metrics["vs_snapshot_1_wins"] == 0.0
    assert metrics["selfplay_snapshots"] == 2.0
    assert metrics["selfplay_pool_bytes"] == 16.0  # two int64 [1]
    assert set(k for k in metrics if k.startswith("elo_")) == {
        "elo_learner", "elo_snapshot_0", "elo_snapshot_1",
    }  # fmt: skip
    assert metrics["elo_learner"] + metrics["elo_snapshot_0"] == pytest.approx(2000.0)
    assert metrics["elo_snapshot_1"] == 1000.0  # frozen before any game, never played
    assert tensorboard_tag("elo_learner") == "elo/learner"
    assert tensorboard_tag("vs_snapshot_0_wins") == "selfplay/vs_snapshot_0_wins"


def test_league_state_round_trip() -> None:
    league = League(PoolConfig(snapshot_every=1, pool_size=3, opponent_sampling="pfsp"), seed=4)
    for step in range(5):
        league.on_step(step, tensor_weights(step))
        league.record(league.opponent(), Outcome.WIN if step % 2 else Outcome.LOSS)
    other = League(league.pool.config, seed=0)
    other.load_state_dict(league.state_dict())
    assert other.ratings.table() == league.ratings.table()
    assert other.metrics() == league.metrics()
    assert [other.opponent() for _ in range(20)] == [league.opponent() for _ in range(20)]


def test_rating_history_and_plot(tmp_path: Path) -> None:
    records = [
        {"learner_steps": 0, "frames": 0, "elo_learner": 1000.0},
        {"learner_steps": 10, "elo_learner": 1010.0, "elo_snapshot_0": 990.0},
        {"learner_steps": 20, "elo_learner": 1020.0, "elo_snapshot_0": 985.0,
         "elo_snapshot_1": 1012.0},
    ]  # fmt: skip
    history = rating_history(records)
    assert list(history) == ["learner", "snapshot_0", "snapshot_1"]
    assert history["learner"].steps.tolist() == [0, 10, 20]
    assert (history["snapshot_0"].first_step, history["snapshot_0"].last) == (10, 985.0)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    png = plot_ratings(tmp_path)
    assert png == tmp_path / "ratings.png" and png.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="no elo_"):
        (tmp_path / "metrics.jsonl").write_text(json.dumps({"learner_steps": 1}) + "\n")
        plot_ratings(tmp_path)


def test_snapshot_ratings_rise_with_a_learner_that_gets_stronger() -> None:
    # The "learner" plays the heuristic with probability step / steps, else randomly: its
    # strength rises by construction, so snapshots frozen later must end up rated higher.
    config = PoolConfig(snapshot_every=4, pool_size=10, opponent_sampling="uniform")
    league, records = run_league(steps=24, games_per_step=4, config=config, seed=1)
    snapshots = sorted(
        (s.first_step, s.last) for p, s in rating_history(records).items() if p != "learner"
    )
    assert len(snapshots) == 7
    steps, ratings = zip(*snapshots, strict=True)
    assert rank_correlation(steps, ratings) >= 0.8, snapshots
    assert ratings[-1] > ratings[0]
    assert league.ratings.rating("learner") > ratings[0]


def test_fixed_opponents_are_rated_and_reported_by_name() -> None:
    config = PoolConfig(
        snapshot_every=1, pool_size=2, fixed_opponents=("heuristic", "bots.c4:greedy")
    )
    league = League(config, seed=0, elo_k=16.0)
    assert league.ratings.table() == {
        "learner": 1000.0,
        "heuristic": 1000.0,
        "bots.c4:greedy": 1000.0,
    }
    for step in range(4):  # snapshots come and go; the fixed opponents' ratings stay
        league.on_step(step, tensor_weights(step))
    league.record(-1, Outcome.LOSS)  # equal ratings: the learner -8, the heuristic +8
    assert league.ratings.rating("heuristic") == 1008.0
    assert league.ratings.rating("learner") == 992.0
    metrics = league.metrics()
    assert metrics["elo_heuristic"] == 1008.0 and metrics["elo_bots_c4_greedy"] == 1000.0
    assert metrics["vs_heuristic_losses"] == 1.0 and metrics["vs_bots_c4_greedy_wins"] == 0.0
    assert set(league.ratings.table()) == {
        "learner", "heuristic", "bots.c4:greedy", "snapshot-2", "snapshot-3",
    }  # fmt: skip
    resumed = League(PoolConfig(snapshot_every=1, pool_size=2, fixed_opponents=("random",)), 0)
    resumed.load_state_dict(league.state_dict())  # a resumed run that names another one
    assert resumed.ratings.rating("random") == 1000.0
    assert "heuristic" not in resumed.ratings.table()


def test_the_yardstick_is_the_lowest_score_over_each_fixed_opponents_last_games() -> None:
    config = PoolConfig(snapshot_every=1, pool_size=2, fixed_opponents=("heuristic", "random"))
    league = League(config, seed=0)
    league.on_step(0, tensor_weights(0))
    # Against the heuristic (id -1): 60 wins, 20 draws, 20 losses -> (60 + 10) / 100.
    for outcome in [Outcome.WIN] * 60 + [Outcome.DRAW] * 20 + [Outcome.LOSS] * 20:
        league.record(-1, outcome)
    for _ in range(99):  # against random (id -2): all won, one game short of a full window
        league.record(-2, Outcome.WIN)
    league.record(0, Outcome.LOSS)  # a snapshot's game is no part of it
    assert league.yardstick() is None
    assert "selfplay_yardstick" not in league.metrics()
    league.record(-2, Outcome.WIN)
    assert league.yardstick() == pytest.approx(0.70)  # min(0.70, 1.00)
    # Only the latest 100 games count: 30 more wins push out 30 of the oldest wins.
    for _ in range(30):
        league.record(-1, Outcome.WIN)
    assert league.yardstick() == pytest.approx(0.70)
    for _ in range(40):  # 40 more: the other 30 old wins and 10 draws go
        league.record(-1, Outcome.WIN)
    assert league.yardstick() == pytest.approx(0.75)  # 70 wins, 10 draws, 20 losses
    for _ in range(30):  # and the rest: all wins
        league.record(-1, Outcome.WIN)
    assert league.yardstick() == pytest.approx(1.0)
    for _ in range(10):  # now random is the lower: 90 wins, 10 losses
        league.record(-2, Outcome.LOSS)
    assert league.metrics()["selfplay_yardstick"] == pytest.approx(0.90)

    resumed = League(config, seed=1)
    resumed.load_state_dict(league.state_dict())
    assert resumed.yardstick() == pytest.approx(0.90)
    renamed = League(PoolConfig(snapshot_every=1, pool_size=2, fixed_opponents=("random",)), 0)
    renamed.load_state_dict(league.state_dict())  # windows follow the opponent's name
    assert renamed.yardstick() == pytest.approx(0.90)
    assert League(PoolConfig(snapshot_every=1, pool_size=2), seed=0).yardstick() is None
