"""A league of scripted Connect Four players of known, rising strength, run through the
real pool, PFSP sampling, Elo table and two-player games: the check that the ratings
tell a learner's progress, and the figure in docs/self-play.md.

``python -m benchmarks.league_sim --out DIR``: the "learner" at step s plays the one-step
lookahead heuristic with probability s / steps and a random legal move otherwise, so its
strength rises with s by construction; every ``--snapshot-every`` steps that strength is
frozen into the pool, and each step it plays ``--games-per-step`` games against
opponents the pool samples. DIR gets metrics.jsonl (the learner's metric keys), a JSON
summary and ratings.png. Also prints the scripted baselines (heuristic and random
against random, per seat).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from learner.league import arena
from learner.league.league import League
from learner.league.opponents import ConnectFourHeuristic, RandomOpponent
from learner.league.pool import PoolConfig
from learner.league.ratings import LEARNER
from seedrl.metrics import METRICS_FILE

GAME = "pettingzoo.classic.connect_four_v3"


class MixedPlayer:
    """The heuristic with probability ``skill``, else a random legal move."""

    def __init__(self, skill: float, seed: int) -> None:
        self.skill = skill
        self.rng = np.random.default_rng(seed)
        self.heuristic = ConnectFourHeuristic(seed + 1)
        self.random = RandomOpponent(seed + 2)

    def reset(self) -> None:
        pass

    def act(self, obs: Any) -> int:
        return self.heuristic(obs) if self.rng.random() < self.skill else self.random(obs)


def run_league(
    steps: int,
    games_per_step: int,
    config: PoolConfig,
    seed: int = 0,
    logdir: Path | None = None,
    log_every: int = 1,
) -> tuple[League, list[dict[str, Any]]]:
    """Play the league; the metric records (one per ``log_every`` steps)."""
    env = arena.make_aec_env(GAME)
    league = League(config, seed)
    records: list[dict[str, Any]] = []
    game_seed = 0
    for step in range(steps + 1):
        skill = step / steps
        league.on_step(step, {"skill": torch.tensor(skill)})
        learner = MixedPlayer(skill, seed + 7919 * step)
        for game in range(games_per_step):
            snapshot_id = league.opponent()
            opponent_skill = float(league.pool.weights(snapshot_id)["skill"])
            opponent = MixedPlayer(opponent_skill, seed + 104_729 + game_seed)
            me, other = arena.seat_agents(env, learner_first=game % 2 == 0)
            returns, _ = arena.play_game(env, {me: learner, other: opponent}, game_seed, 200)
            league.record(snapshot_id, arena.outcome_of(returns, me, other))
            game_seed += 1
        if step % log_every == 0:
            records.append({"learner_steps": step, "skill": skill, **league.metrics()})
    if logdir is not None:
        logdir.mkdir(parents=True, exist_ok=True)
        with open(logdir / METRICS_FILE, "w") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")
    return league, records


def baselines(games: int, seed: int = 0) -> dict[str, Any]:
    """Heuristic and random players against a random one, per seat."""
    env = arena.make_aec_env(GAME)
    out = {}
    for name, player in (
        ("heuristic", ConnectFourHeuristic(seed)),
        ("random", RandomOpponent(seed)),
    ):
        me = arena.ScriptedPlayer(player)
        result = arena.play_match(env, me, arena.ScriptedPlayer(RandomOpponent(seed + 1)), games)
        out[f"{name} vs random"] = result.to_dict()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.league_sim", description=__doc__)
    parser.add_argument("--out", required=True, help="directory for metrics.jsonl and the PNG")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--games-per-step", type=int, default=10)
    parser.add_argument("--snapshot-every", type=int, default=20)
    parser.add_argument("--pool-size", type=int, default=20)
    parser.add_argument("--opponent-sampling", default="pfsp")
    parser.add_argument("--baseline-games", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    config = PoolConfig(args.snapshot_every, args.pool_size, args.opponent_sampling)
    out = Path(args.out)
    start = time.perf_counter()
    _, records = run_league(args.steps, args.games_per_step, config, args.seed, out)
    elapsed = time.perf_counter() - start
    from learner.league.plot import plot_ratings, rating_history

    history = rating_history(records)
    snapshots = sorted(
        ((s.first_step, s.last) for p, s in history.items() if p != LEARNER),
    )
    summary = {
        "steps": args.steps,
        "games": args.steps * args.games_per_step,
        "seconds": round(elapsed, 1),
        "final": records[-1],
        "snapshot_ratings_by_step": snapshots,
        "rank_correlation": rank_correlation([s for s, _ in snapshots], [r for _, r in snapshots]),
        "baselines": baselines(args.baseline_games, args.seed),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "final"}, indent=2))
    print(plot_ratings(out))
    return 0


def rank_correlation(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (no ties expected)."""
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    return float(np.corrcoef(rx, ry)[0, 1]) if len(x) > 1 else float("nan")


if __name__ == "__main__":
    raise SystemExit(main())
