"""The league as the learner uses it: the snapshot pool and the Elo table kept in step.

One object for the serving and training sides: :meth:`League.add` (or
:meth:`League.on_step`, which adds on the pool's schedule) freezes a snapshot and enters
it in the ratings at the learner's current rating, :meth:`League.opponent` picks an
episode's opponent, :meth:`League.record` counts a finished game for the pool's PFSP
statistics and for both players' ratings, :meth:`League.metrics` gives the flat
metrics.jsonl keys, and ``state_dict`` holds both parts for the checkpoint. Every method
takes :attr:`League.lock`, so a checkpoint written from another thread reads a
consistent league.
"""

from __future__ import annotations

import collections
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from learner.common.measures import YARDSTICK_GAMES
from learner.league.opponents import Opponent
from learner.league.pool import SCORE, Outcome, PoolConfig, SnapshotPool, fixed_id
from learner.league.ratings import LEARNER, EloRatings, snapshot_name

RESULT_WINDOW = 200
"""The learner's latest games the win / draw / loss rates in the metrics cover."""


def metric_name(player: str) -> str:
    """A player's name inside a flat metric key (``snapshot-3`` -> ``snapshot_3``,
    ``my.bots:greedy`` -> ``my_bots_greedy``)."""
    return re.sub(r"\W", "_", player)


ELO_PREFIX = "elo_"
"""Ratings in metrics.jsonl: ``elo_learner``, ``elo_snapshot_3``."""


class League:
    """A :class:`SnapshotPool` and an :class:`EloRatings` over the learner and its snapshots."""

    def __init__(
        self,
        config: PoolConfig,
        seed: int,
        elo_k: float = 16.0,
        scripted: Sequence[Opponent] = (),
    ) -> None:
        self.pool = SnapshotPool(config, seed)
        self.scripted = {fixed_id(i): player for i, player in enumerate(scripted)}
        """The fixed opponents' players by opponent id (``scripted`` in the order the pool
        names them), built once when the run starts."""
        self.ratings = EloRatings(k=elo_k)
        self.ratings.add(LEARNER)
        self._rate_fixed_opponents()
        self.lock = threading.Lock()
        self.recent: collections.deque[Outcome] = collections.deque(maxlen=RESULT_WINDOW)
        """The learner's latest results, for the rates in the metrics."""
        self.recent_fixed: dict[str, collections.deque[Outcome]] = {
            self.player(i): collections.deque(maxlen=YARDSTICK_GAMES) for i in self.pool.fixed_ids()
        }
        """The learner's latest results against each fixed opponent, by its name."""

    @classmethod
    def for_config(cls, config: Any, scripted: Sequence[Opponent] = ()) -> League:
        """The league of a :class:`seedrl.config.LearnerConfig` (its pool flags and seed),
        with the players of its fixed opponents."""
        return cls(PoolConfig.of(config), config.seed, scripted=scripted)

    def add(self, learner_step: int, state_dict: Mapping[str, torch.Tensor]) -> int:
        """Freeze a snapshot now, rated as the learner is now; its id."""
        with self.lock:
            snapshot_id = self.pool.add(learner_step, state_dict)
            self.ratings.add(snapshot_name(snapshot_id), like=LEARNER)
            self._forget_evicted()
            return snapshot_id

    def on_step(self, learner_step: int, state_dict: Mapping[str, torch.Tensor]) -> int | None:
        """:meth:`add` when the pool's schedule says a snapshot is due; its id, else None."""
        with self.lock:
            due = self.pool.due(learner_step)
        return self.add(learner_step, state_dict) if due else None

    def player(self, opponent_id: int) -> str:
        """The ratings' name of an opponent: a fixed one's configured name, else
        ``snapshot-<id>``."""
        return self.pool.fixed_name(opponent_id) or snapshot_name(opponent_id)

    def opponent(self) -> int:
        """The opponent id (a snapshot's, or a fixed opponent's) for a new episode."""
        with self.lock:
            return self.pool.sample()

    def record(self, snapshot_id: int, outcome: Outcome) -> None:
        """The learning policy's result of one episode against ``snapshot_id`` (one
        evicted while the game ran counts in the rates only)."""
        with self.lock:
            self.pool.record(snapshot_id, outcome)
            self.recent.append(outcome)
            fixed = self.recent_fixed.get(self.player(snapshot_id))
            if fixed is not None:
                fixed.append(outcome)
            if snapshot_id in self.pool:
                self.ratings.update(LEARNER, self.player(snapshot_id), SCORE[outcome])

    def yardstick(self) -> float | None:
        """The learner's lowest score (a win 1, a draw 1/2) over its latest
        ``YARDSTICK_GAMES`` games against each fixed opponent; None without fixed opponents
        or before each has been played that often. Scripted players do not change, so,
        unlike the return against a pool that strengthens with the learner, this compares
        the learner at one point of the run with another (what checkpoint-best.pt keeps)."""
        with self.lock:
            return self._yardstick()

    def _yardstick(self) -> float | None:
        windows = list(self.recent_fixed.values())
        if not windows or any(len(w) < YARDSTICK_GAMES for w in windows):
            return None
        return min(sum(SCORE[o] for o in w) / len(w) for w in windows)

    def metrics(self) -> dict[str, float]:
        """Flat metrics.jsonl keys: ``elo_<player>`` for the learner and each kept
        snapshot, ``selfplay_{win,draw,loss}_rate`` over the latest games,
        ``vs_snapshot_<id>_{wins,draws,losses}`` per kept snapshot, the pool's size
        (``selfplay_snapshots``) and memory (``selfplay_pool_bytes``), and once there is one
        the :meth:`yardstick` (``selfplay_yardstick``)."""
        with self.lock:
            out = {ELO_PREFIX + metric_name(p): r for p, r in self.ratings.table().items()}
            out["selfplay_snapshots"] = float(len(self.pool))
            out["selfplay_pool_bytes"] = float(self.pool.nbytes())
            if self.recent:
                n = len(self.recent)
                for outcome in Outcome:
                    rate = sum(o is outcome for o in self.recent) / n
                    out[f"selfplay_{outcome.value}_rate"] = rate
            yardstick = self._yardstick()
            if yardstick is not None:
                out["selfplay_yardstick"] = yardstick
            for snapshot_id, (wins, draws, losses) in self.pool.results().items():
                key = f"vs_{metric_name(self.player(snapshot_id))}_"
                out[key + "wins"] = float(wins)
                out[key + "draws"] = float(draws)
                out[key + "losses"] = float(losses)
            return out

    def state_dict(self) -> dict[str, Any]:
        with self.lock:
            return {
                "pool": self.pool.state_dict(),
                "ratings": self.ratings.state_dict(),
                "recent": [o.value for o in self.recent],
                "recent_fixed": {k: [o.value for o in w] for k, w in self.recent_fixed.items()},
            }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        with self.lock:
            self.pool.load_state_dict(state["pool"])
            self.ratings.load_state_dict(state["ratings"])
            self.recent.clear()
            self.recent.extend(Outcome(v) for v in state.get("recent", []))
            saved = state.get("recent_fixed", {})
            for name, window in self.recent_fixed.items():  # a fixed opponent by its name
                window.clear()
                window.extend(Outcome(v) for v in saved.get(name, []))
            self._rate_fixed_opponents()
            self._forget_evicted()

    def _rate_fixed_opponents(self) -> None:
        """Enter each fixed opponent not yet rated (a new league, or a resumed one whose
        run named other fixed opponents) at the initial rating."""
        rated = self.ratings.table()
        for opponent_id in self.pool.fixed_ids():
            if self.player(opponent_id) not in rated:
                self.ratings.add(self.player(opponent_id))

    def _forget_evicted(self) -> None:
        """Drop evicted snapshots' ratings: no game can move them any more, and a long run
        would otherwise log one more metric per snapshot forever."""
        kept = {self.player(i) for i in self.pool.opponent_ids()}
        for player in list(self.ratings.table()):
            if player != LEARNER and player not in kept:
                self.ratings.remove(player)
