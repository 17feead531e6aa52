"""The league as the learner uses it: the snapshot pool and the Elo table kept in step.

One object for the serving and training sides to call: :meth:`League.on_step` after each
learner step (freezes a snapshot on schedule and rates it as the learner is rated now),
:meth:`League.opponent` at an episode start, :meth:`League.record` at its end (the
result counts for the pool's PFSP statistics and for both players' ratings), and
:meth:`League.metrics` for metrics.jsonl / TensorBoard. Its ``state_dict`` holds both
parts for the checkpoint.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from typing import Any

import torch

from learner.league.pool import SCORE, Outcome, PoolConfig, SnapshotPool
from learner.league.ratings import LEARNER, EloRatings, snapshot_name

RECENT_GAMES = 100
"""The overall win / draw / loss rates are over this many latest games (as returns are
over the last 100 episodes)."""
METRIC_PREFIX = "league/"


class League:
    """A :class:`SnapshotPool` and an :class:`EloRatings` over the learner and its snapshots."""

    def __init__(self, config: PoolConfig, seed: int, elo_k: float = 16.0) -> None:
        self.pool = SnapshotPool(config, seed)
        self.ratings = EloRatings(k=elo_k)
        self.ratings.add(LEARNER)
        self._recent: collections.deque[Outcome] = collections.deque(maxlen=RECENT_GAMES)

    def on_step(self, learner_step: int, state_dict: Mapping[str, torch.Tensor]) -> int | None:
        """Freeze a snapshot when one is due; its id (rated as the learner is now), else None."""
        snapshot_id = self.pool.maybe_add(learner_step, state_dict)
        if snapshot_id is not None:
            self.ratings.add(snapshot_name(snapshot_id), like=LEARNER)
            self._forget_evicted()
        return snapshot_id

    def opponent(self) -> int:
        """The snapshot id for a new episode's opponent seat."""
        return self.pool.sample()

    def record(self, snapshot_id: int, outcome: Outcome) -> None:
        """The learning policy's result of one episode against ``snapshot_id``."""
        self.pool.record(snapshot_id, outcome)
        self._recent.append(outcome)
        if snapshot_id in self.pool:
            self.ratings.update(LEARNER, snapshot_name(snapshot_id), SCORE[outcome])

    def metrics(self) -> dict[str, float]:
        """``elo/<player>`` ratings, the learner's rates over the last games and per kept
        snapshot (``league/snapshot-<id>/win`` ...), and the pool's size and memory."""
        out: dict[str, float] = dict(self.ratings.metrics())
        out[METRIC_PREFIX + "snapshots"] = float(len(self.pool))
        out[METRIC_PREFIX + "pool_bytes"] = float(self.pool.nbytes())
        if self._recent:
            n = len(self._recent)
            for outcome in Outcome:
                rate = sum(o is outcome for o in self._recent) / n
                out[f"{METRIC_PREFIX}{outcome.value}_rate"] = rate
        for snapshot_id, (wins, draws, losses) in self.pool.results().items():
            games = wins + draws + losses
            if not games:
                continue
            key = f"{METRIC_PREFIX}{snapshot_name(snapshot_id)}/"
            out[key + "games"] = float(games)
            out[key + "win"] = wins / games
            out[key + "draw"] = draws / games
            out[key + "loss"] = losses / games
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "pool": self.pool.state_dict(),
            "ratings": self.ratings.state_dict(),
            "recent": [o.value for o in self._recent],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.pool.load_state_dict(state["pool"])
        self.ratings.load_state_dict(state["ratings"])
        self._recent.clear()
        self._recent.extend(Outcome(v) for v in state.get("recent", []))
        self._forget_evicted()

    def _forget_evicted(self) -> None:
        """Drop evicted snapshots' ratings: no game can move them any more, and a long run
        would otherwise log one more metric per snapshot forever."""
        kept = {snapshot_name(i) for i in self.pool.ids()}
        for player in list(self.ratings.table()):
            if player != LEARNER and player not in kept:
                self.ratings.remove(player)
