"""``python -m learner tournament``: every snapshot of a self-play checkpoint's pool (and
the checkpoint's own policy) against every other, Elo fitted to all the results.

During training each snapshot only meets the learner, and its rating follows the
learner's; here they all meet each other in the same games, so the ratings are
comparable across the whole pool and do not depend on the order games were played in
(:func:`learner.league.ratings.fit_elo`). The table is printed by the learner step each
player was frozen at, and drawn as rating vs learner steps (``--png``).
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from learner.agents.trained_policy import Policy
from learner.league import arena
from learner.league.pool import Outcome
from learner.league.ratings import LEARNER, fit_elo, snapshot_name
from learner.state import checkpoint
from seedrl import envs

SELF_PLAY_KEY = "self_play"
"""Where a self-play checkpoint keeps its league (``{"pool": ..., "ratings": ...}``)."""


@dataclass
class Entrant:
    name: str
    learner_step: int
    policy: Policy


def entrants(path: Path, greedy: bool, max_players: int = 0) -> list[Entrant]:
    """The checkpoint's pool snapshots, oldest first, then its own policy; with
    ``max_players`` an even spread of that many (the newest always in)."""
    state = checkpoint.load(path)
    league = state.get(SELF_PLAY_KEY)
    if not isinstance(league, dict) or "pool" not in league:
        raise ValueError(
            f"{path}: no self-play pool in this checkpoint (trained with --self-play?)"
        )
    learner = Policy.load(path, greedy=greedy)
    out = []
    for snapshot in league["pool"]["snapshots"]:
        model = copy.deepcopy(learner.model)
        model.load_state_dict(snapshot["weights"])
        policy = Policy(model, learner.head, learner.env_spec, greedy)
        name = snapshot_name(int(snapshot["id"]))
        out.append(Entrant(name, int(snapshot["learner_step"]), policy))
    out.append(Entrant(LEARNER, int(state.get("learner_steps", 0)), learner))
    if max_players and len(out) > max_players:
        keep = np.unique(np.linspace(0, len(out) - 1, max_players).round().astype(int))
        out = [out[i] for i in keep]
    return out


def round_robin(
    env: Any, players: list[Entrant], games: int, seed: int = 0, max_steps: int = 10_000
) -> dict[tuple[str, str], tuple[float, float, float]]:
    """Each pair plays ``games`` games with either one moving first; (a's wins, draws,
    b's wins) per pair."""
    results = {}
    game_seed = seed
    for a, b in itertools.combinations(players, 2):
        wins_a = draws = wins_b = 0
        for a_first in (True, False):
            me, other = arena.seat_agents(env, a_first)
            for _ in range(games):
                returns, _ = arena.play_game(
                    env, {me: a.policy, other: b.policy}, game_seed, max_steps
                )
                game_seed += 1
                outcome = arena.outcome_of(returns, me, other)
                wins_a += outcome is Outcome.WIN
                draws += outcome is Outcome.DRAW
                wins_b += outcome is Outcome.LOSS
        results[(a.name, b.name)] = (float(wins_a), float(draws), float(wins_b))
    return results


def plot(players: list[Entrant], ratings: dict[str, float], out: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.ticker import EngFormatter

    fig, ax = plt.subplots(figsize=(7, 4.2), constrained_layout=True)
    steps = [p.learner_step for p in players]
    ax.plot(steps, [ratings[p.name] for p in players], "o-", color="tab:purple", markersize=4)
    ax.set_xlabel("learner steps (when frozen)")
    ax.set_ylabel("Elo (round robin, mean 1000)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m learner tournament", description=__doc__)
    parser.add_argument("--checkpoint", required=True, help="a self-play checkpoint or logdir")
    parser.add_argument("--games", type=int, default=10, help="games per pair and seat")
    parser.add_argument(
        "--max-players", type=int, default=0,
        help="rate an even spread of this many (the pool's newest and the learner included); "
        "0: all. Pairs grow as its square",
    )  # fmt: skip
    parser.add_argument(
        "--greedy", action="store_true",
        help="most likely actions (two greedy players repeat one game; default: sampled)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="torch seed of the sampled actions")
    parser.add_argument("--max-steps", type=int, default=10_000, help="turn cap per game")
    parser.add_argument("--png", help="draw Elo vs learner steps to this PNG")
    parser.add_argument("--json", help="also write players, results and ratings here")
    parser.add_argument(
        envs.ALLOW_ENV_MODULE_FLAG, dest="allow_env_module", action="append", default=[],
        metavar="MODULE", help="build the checkpoint's module:callable game from MODULE",
    )  # fmt: skip
    args = parser.parse_args(argv)
    path = Path(args.checkpoint)
    if path.is_dir():
        path = path / "checkpoint.pt"
    try:
        if args.games < 1:
            raise ValueError(f"--games must be >= 1, got {args.games}")
        players = entrants(path, args.greedy, args.max_players)
        env_id = players[-1].policy.env_id
        arena.check_aec_env_allowed(env_id, args.allow_env_module, f"checkpoint {path}")
        env = arena.make_aec_env(env_id, players[-1].policy.env_kwargs)
        torch.manual_seed(args.seed)
        results = round_robin(env, players, args.games, args.seed, args.max_steps)
        ratings = fit_elo(results)
    except (checkpoint.CheckpointError, envs.EnvError, ValueError) as exc:
        parser.exit(2, f"error: {exc}\n")
    score = dict.fromkeys(ratings, 0.0)
    played = dict.fromkeys(ratings, 0.0)
    for (a, b), (wins_a, draws, wins_b) in results.items():
        total = wins_a + draws + wins_b
        score[a] += wins_a + draws / 2
        score[b] += wins_b + draws / 2
        played[a] += total
        played[b] += total
    pairs = len(results)
    print(
        f"seedrl tournament: {env_id}, {len(players)} players, {pairs} pairs x "
        f"{2 * args.games} games ({'greedy' if args.greedy else 'sampled'})"
    )
    print(f"  {'player':<14} {'learner step':>12} {'Elo':>7} {'score':>7}")
    for p in players:
        share = score[p.name] / played[p.name]
        print(f"  {p.name:<14} {p.learner_step:>12,} {ratings[p.name]:>7.0f} {share:>7.1%}")
    if args.png:
        print(plot(players, ratings, Path(args.png), f"round robin - {path.parent.name}"))
    if args.json:
        data = {
            "players": [{"name": p.name, "learner_step": p.learner_step} for p in players],
            "results": [[a, b, *r] for (a, b), r in results.items()],
            "ratings": ratings,
        }
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n")
    return 0
