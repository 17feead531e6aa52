"""Elo ratings of the learning policy and its frozen snapshots.

Elo (Elo, "The Rating of Chessplayers, Past and Present", 1978), as AlphaZero and
AlphaStar report strength: player A's expected score against B is
``E_A = 1 / (1 + 10 ** ((R_B - R_A) / 400))`` and one game with A's score ``S_A``
(1 win, 0.5 draw, 0 loss) moves ``R_A += k (S_A - E_A)`` and ``R_B`` by the opposite
amount, so the sum of ratings is conserved. A snapshot is born with the learner's rating
at the step it was frozen (:meth:`EloRatings.add`), so the snapshots' ratings, read in the
order they were frozen, trace how the learner's strength grew.

Player names: ``"learner"`` and ``"snapshot-<id>"`` (:func:`snapshot_name`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

LEARNER = "learner"


def snapshot_name(snapshot_id: int) -> str:
    """The ratings' name of a pool snapshot."""
    return f"snapshot-{snapshot_id}"


def expected_score(rating_a: float, rating_b: float) -> float:
    """A's expected score against B (its win probability, a draw counting half)."""
    return 1.0 / (1.0 + 10.0 ** ((rating_b - rating_a) / 400.0))


class EloRatings:
    """Ratings of named players; an unseen player starts at ``initial``."""

    def __init__(self, k: float = 16.0, initial: float = 1000.0) -> None:
        if not k > 0:
            raise ValueError(f"Elo k must be > 0, got {k}")
        self.k = k
        self.initial = initial
        self._ratings: dict[str, float] = {}
        self._games: dict[str, int] = {}

    def add(self, player: str, rating: float | None = None, like: str | None = None) -> None:
        """Enter ``player`` with ``rating``, or the current rating of ``like`` (a snapshot
        starts as strong as the learner it was frozen from), or ``initial``."""
        if rating is None:
            rating = self.rating(like) if like is not None else self.initial
        self._ratings[player] = float(rating)
        self._games.setdefault(player, 0)

    def update(self, a: str, b: str, score_a: float) -> None:
        """One game of ``a`` against ``b``: ``score_a`` is 1 (a won), 0.5 (draw) or 0."""
        if not 0.0 <= score_a <= 1.0:
            raise ValueError(f"score must be in [0, 1], got {score_a}")
        if a == b:
            raise ValueError(f"a player cannot be rated against itself ({a!r})")
        rating_a, rating_b = self.rating(a), self.rating(b)
        delta = self.k * (score_a - expected_score(rating_a, rating_b))
        self._ratings[a] = rating_a + delta
        self._ratings[b] = rating_b - delta
        self._games[a] = self._games.get(a, 0) + 1
        self._games[b] = self._games.get(b, 0) + 1

    def rating(self, player: str) -> float:
        """``player``'s rating (``initial`` for one never seen)."""
        return self._ratings.get(player, self.initial)

    def games(self, player: str) -> int:
        """Games ``player`` has been rated on."""
        return self._games.get(player, 0)

    def table(self) -> dict[str, float]:
        """Every player's rating, in the order they were first seen."""
        return dict(self._ratings)

    def remove(self, player: str) -> None:
        """Forget a player (e.g. an evicted snapshot no longer worth a metric)."""
        self._ratings.pop(player, None)
        self._games.pop(player, None)

    def state_dict(self) -> dict[str, Any]:
        return {
            "k": self.k,
            "initial": self.initial,
            "ratings": dict(self._ratings),
            "games": dict(self._games),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore saved ratings (this object's ``k`` and ``initial`` are kept: they are
        this run's choice)."""
        self._ratings = {str(p): float(r) for p, r in state["ratings"].items()}
        self._games = {str(p): int(n) for p, n in state.get("games", {}).items()}


def fit_elo(
    results: Mapping[tuple[str, str], tuple[float, float, float]],
    prior_draws: float = 1.0,
    anchor: float = 1000.0,
    iterations: int = 10_000,
    tolerance: float = 1e-10,
) -> dict[str, float]:
    """Ratings that best explain a whole tournament at once, on the Elo scale.

    ``results[(a, b)] = (a's wins, draws, b's wins)``. The maximum-likelihood Bradley-Terry
    strengths ``gamma`` (P[a beats b] = gamma_a / (gamma_a + gamma_b), the model Elo's
    expected score is), found by Hunter's MM iteration (Hunter, "MM algorithms for
    generalized Bradley-Terry models", Ann. Statist. 32(1), 2004), with a draw counting
    half a win to each side, then ``R = 400 log10(gamma)`` shifted so the mean is
    ``anchor``. Unlike game-by-game updates the fit does not depend on the order games
    were played in. ``prior_draws`` virtual draws per pair that met keep a player who
    won (or lost) every game at a finite rating.
    """
    players = sorted({p for pair in results for p in pair})
    index = {p: i for i, p in enumerate(players)}
    n = len(players)
    games_NN = np.zeros((n, n))
    score_N = np.zeros(n)
    for (a, b), (wins_a, draws, wins_b) in results.items():
        if a == b:
            raise ValueError(f"a player cannot be rated against itself ({a!r})")
        i, j = index[a], index[b]
        total = wins_a + draws + wins_b + prior_draws
        games_NN[i, j] += total
        games_NN[j, i] += total
        score_N[i] += wins_a + 0.5 * (draws + prior_draws)
        score_N[j] += wins_b + 0.5 * (draws + prior_draws)
    if np.any(score_N <= 0):
        zero = [players[i] for i in np.flatnonzero(score_N <= 0)]
        raise ValueError(f"{', '.join(zero)} scored nothing: give prior_draws > 0 to rate them")
    gamma_N = np.ones(n)
    for _ in range(iterations):
        pair_NN = games_NN / (gamma_N[:, None] + gamma_N[None, :])
        new_N = score_N / pair_NN.sum(axis=1)
        new_N /= np.exp(np.mean(np.log(new_N)))  # only ratios matter: fix the scale
        done = np.max(np.abs(np.log(new_N / gamma_N))) < tolerance
        gamma_N = new_N
        if done:
            break
    ratings_N = 400.0 * np.log10(gamma_N)
    ratings_N += anchor - ratings_N.mean()
    return {p: float(r) for p, r in zip(players, ratings_N, strict=True)}
