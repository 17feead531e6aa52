"""A bounded pool of frozen past selves and the choice of each episode's opponent.

Every ``snapshot_every`` learner steps the learning policy's weights are copied to CPU
and frozen as a snapshot; at each episode start the opponent seat gets one of them,
chosen by ``opponent_sampling``:

* ``latest``: the newest snapshot (classic self-play, prone to strategy cycles);
* ``uniform``: any kept snapshot with equal chance (fictitious self-play over the pool);
* ``pfsp``: prioritized fictitious self-play (Vinyals et al., "Grandmaster level in
  StarCraft II using multi-agent reinforcement learning", Nature 575, 2019, Methods,
  "Prioritized fictitious self-play"): opponent ``B`` is drawn with probability
  proportional to ``f_hard(P[learner beats B]) = (1 - P[learner beats B]) ** p``, so
  snapshots the learner still loses to are played most and ones it always beats rarely.
  ``P`` is the learner's score against ``B`` (a draw counts half) smoothed by one prior
  draw, ``(wins + draws / 2 + 1 / 2) / (games + 1)``, so an unplayed snapshot weighs as
  an even match and no snapshot's weight is ever exactly 0.

Beside the snapshots, ``fixed_opponents`` (scripted players: random, a heuristic, a
function the user brings) stay in the pool for good. They are drawn by the same rule (for
``latest``: the newest snapshot or any fixed opponent, with equal chance), so under
``pfsp`` a scripted player the learner still loses to is played most, and one it always
beats only as often as its prior weight says. Their ids are negative (-1 for the first
named), never evicted and never counted as snapshots.

Snapshots are whole ``state_dict`` copies in CPU memory (device memory is kept for the
learner's own model and batches); a snapshot costs the model's parameter bytes
(:meth:`SnapshotPool.nbytes`; docs/self-play.md gives the figure for the Connect Four
model). The pool keeps at most ``pool_size``: adding one more evicts the oldest, so the
newest is always there. The pool, its results and its random generator go into the
learner's checkpoint (:meth:`SnapshotPool.state_dict`), so ``--resume`` continues with
the same opponents and the same draws.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from seedrl.config import OPPONENT_SAMPLING, LearnerConfig


class Outcome(enum.Enum):
    """An episode's result from the learning policy's side."""

    WIN = "win"
    DRAW = "draw"
    LOSS = "loss"


SCORE = {Outcome.WIN: 1.0, Outcome.DRAW: 0.5, Outcome.LOSS: 0.0}
"""The learning policy's score per outcome, as Elo counts it."""


@dataclasses.dataclass(frozen=True)
class PoolConfig:
    """How the pool of past selves fills and picks opponents (the LearnerConfig flags of
    the same names)."""

    snapshot_every: int = LearnerConfig.snapshot_every
    """--snapshot-every: learner steps between frozen snapshots."""
    pool_size: int = LearnerConfig.pool_size
    """--pool-size: snapshots kept (oldest evicted; the newest always kept)."""
    opponent_sampling: str = LearnerConfig.opponent_sampling
    """--opponent-sampling latest|uniform|pfsp: how an episode's opponent is chosen."""
    pfsp_exponent: float = LearnerConfig.pfsp_exponent
    """--pfsp-exponent: p in AlphaStar's f_hard(x) = (1 - x)^p; larger focuses harder on
    the snapshots the learner loses to (0: uniform)."""
    fixed_opponents: tuple[str, ...] = LearnerConfig.fixed_opponents
    """--fixed-opponents: scripted players kept in the pool for good (ids -1, -2, ...)."""
    fixed_opponent_share: float | None = LearnerConfig.fixed_opponent_share
    """--fixed-opponent-share: the fixed opponents' chance of an episode (None: drawn with
    the snapshots by one rule)."""

    def __post_init__(self) -> None:
        if self.snapshot_every < 1:
            raise ValueError(f"--snapshot-every must be >= 1, got {self.snapshot_every}")
        if self.pool_size < 1:
            raise ValueError(f"--pool-size must be >= 1, got {self.pool_size}")
        if self.opponent_sampling not in OPPONENT_SAMPLING:
            allowed = ", ".join(OPPONENT_SAMPLING[:-1]) + f" or {OPPONENT_SAMPLING[-1]}"
            raise ValueError(
                f"--opponent-sampling must be {allowed}, got {self.opponent_sampling!r}"
            )
        if not self.pfsp_exponent >= 0:  # also refuses NaN
            raise ValueError(f"--pfsp-exponent must be >= 0, got {self.pfsp_exponent}")
        if len(set(self.fixed_opponents)) != len(self.fixed_opponents):
            raise ValueError(f"--fixed-opponents names one twice: {self.fixed_opponents}")
        share = self.fixed_opponent_share
        if share is not None:
            if not 0 <= share <= 1:  # also refuses NaN
                raise ValueError(f"--fixed-opponent-share must be in [0, 1], got {share}")
            if not self.fixed_opponents:
                raise ValueError("--fixed-opponent-share needs --fixed-opponents")

    @classmethod
    def of(cls, config: Any) -> PoolConfig:
        """The pool fields of a :class:`seedrl.config.LearnerConfig` (or any object with them)."""
        values = {f.name: getattr(config, f.name) for f in dataclasses.fields(cls)}
        values["fixed_opponents"] = tuple(values["fixed_opponents"])
        return cls(**values)


def fixed_id(index: int) -> int:
    """The pool id of the ``index``-th fixed opponent (-1, -2, ...)."""
    return -1 - index


def pfsp_weight(wins: int, draws: int, losses: int, exponent: float) -> float:
    """AlphaStar's f_hard of the learner's smoothed score against one snapshot."""
    games = wins + draws + losses
    p_beat = (wins + 0.5 * draws + 0.5) / (games + 1)
    return float((1.0 - p_beat) ** exponent)


@dataclasses.dataclass
class _Snapshot:
    learner_step: int
    weights: dict[str, torch.Tensor]
    results: list[int]  # wins, draws, losses


class SnapshotPool:
    """Frozen CPU copies of the learning policy, ids counting up from 0, at most
    ``config.pool_size`` kept; and the fixed opponents, ids counting down from -1."""

    def __init__(self, config: PoolConfig, seed: int) -> None:
        self.config = config
        self._rng = np.random.default_rng(seed)
        self._snapshots: dict[int, _Snapshot] = {}  # insertion order: oldest first
        self._fixed: dict[int, list[int]] = {
            fixed_id(i): [0, 0, 0] for i in range(len(config.fixed_opponents))
        }
        """Fixed opponent id -> the learning policy's wins, draws, losses against it."""
        self._next_id = 0
        self._last_step: int | None = None

    def due(self, learner_step: int) -> bool:
        """Whether a snapshot is due: the pool is empty or ``snapshot_every`` steps have
        passed since the last one."""
        last = self._last_step
        return last is None or learner_step - last >= self.config.snapshot_every

    def maybe_add(self, learner_step: int, state_dict: Mapping[str, torch.Tensor]) -> int | None:
        """Freeze a snapshot when one is due (:meth:`due`); its id, else None."""
        return self.add(learner_step, state_dict) if self.due(learner_step) else None

    def add(self, learner_step: int, state_dict: Mapping[str, torch.Tensor]) -> int:
        """Freeze a CPU copy of ``state_dict`` now (evicting the oldest if full); its id."""
        weights = {k: v.detach().to("cpu", copy=True) for k, v in state_dict.items()}
        snapshot_id = self._next_id
        self._next_id += 1
        self._snapshots[snapshot_id] = _Snapshot(learner_step, weights, [0, 0, 0])
        self._last_step = learner_step
        while len(self._snapshots) > self.config.pool_size:
            del self._snapshots[next(iter(self._snapshots))]
        return snapshot_id

    def ids(self) -> list[int]:
        """Kept snapshots, oldest first."""
        return list(self._snapshots)

    def fixed_ids(self) -> list[int]:
        """The fixed opponents, in the order ``fixed_opponents`` names them."""
        return list(self._fixed)

    def fixed_name(self, opponent_id: int) -> str | None:
        """The fixed opponent's name as configured; None for a snapshot id."""
        if opponent_id not in self._fixed:
            return None
        return self.config.fixed_opponents[-1 - opponent_id]

    def opponent_ids(self) -> list[int]:
        """Every id an episode's opponent can have: fixed opponents, then snapshots."""
        return [*self._fixed, *self._snapshots]

    def learner_step(self, snapshot_id: int) -> int:
        """The learner step at which the snapshot was frozen."""
        return self._get(snapshot_id).learner_step

    def weights(self, snapshot_id: int) -> dict[str, torch.Tensor]:
        """The snapshot's frozen weights (CPU tensors; shared, so do not write to them)."""
        return dict(self._get(snapshot_id).weights)

    def __len__(self) -> int:
        return len(self._snapshots)

    def __contains__(self, opponent_id: object) -> bool:
        return opponent_id in self._snapshots or opponent_id in self._fixed

    def probabilities(self) -> dict[int, float]:
        """Each opponent's chance of being the next one under the pool's rule (fixed
        opponents and kept snapshots; empty until the first snapshot)."""
        if not self._snapshots:
            return {}
        ids = self.opponent_ids()
        rule = self.config.opponent_sampling
        if rule == "latest":
            newest = next(reversed(self._snapshots))
            weights = [float(i in self._fixed or i == newest) for i in ids]
        elif rule == "uniform":
            weights = [1.0] * len(ids)
        else:
            p = self.config.pfsp_exponent
            weights = [pfsp_weight(*self._results_of(i), p) for i in ids]
        share = self.config.fixed_opponent_share
        if share is None:
            total = sum(weights)
            return {i: w / total for i, w in zip(ids, weights, strict=True)}
        # Two sources, as AlphaStar's matchmaking mixes them: the share goes to the fixed
        # opponents, the rest to the snapshots, each split by the rule within its source.
        fixed_total = sum(w for i, w in zip(ids, weights, strict=True) if i in self._fixed)
        snapshot_total = sum(weights) - fixed_total
        return {
            i: (share * w / fixed_total if i in self._fixed else (1 - share) * w / snapshot_total)
            for i, w in zip(ids, weights, strict=True)
        }

    def sample(self) -> int:
        """An opponent for a new episode (LookupError while the pool has no snapshot)."""
        if not self._snapshots:
            raise LookupError("the snapshot pool is empty: add the first snapshot before sampling")
        if self.config.opponent_sampling == "latest" and not self._fixed:
            return next(reversed(self._snapshots))
        probabilities = self.probabilities()
        ids = list(probabilities)
        return ids[int(self._rng.choice(len(ids), p=list(probabilities.values())))]

    def record(self, opponent_id: int, outcome: Outcome) -> None:
        """Count the learning policy's result of one episode against the opponent (a
        snapshot evicted while the episode ran is ignored: its games no longer steer
        sampling)."""
        if opponent_id in self._fixed:
            self._fixed[opponent_id][_INDEX[outcome]] += 1
            return
        snapshot = self._snapshots.get(opponent_id)
        if snapshot is None:
            if not 0 <= opponent_id < self._next_id:
                raise KeyError(f"no snapshot {opponent_id} was ever in this pool")
            return
        snapshot.results[_INDEX[outcome]] += 1

    def results(self) -> dict[int, tuple[int, int, int]]:
        """Opponent id (fixed ones, kept snapshots) -> the learning policy's (wins, draws,
        losses) against it."""
        return {i: self._results_of(i) for i in self.opponent_ids()}

    def _results_of(self, opponent_id: int) -> tuple[int, int, int]:
        fixed = self._fixed.get(opponent_id)
        wins, draws, losses = fixed if fixed is not None else self._snapshots[opponent_id].results
        return wins, draws, losses

    def nbytes(self) -> int:
        """CPU memory the kept snapshots' tensors take."""
        return sum(
            t.numel() * t.element_size()
            for s in self._snapshots.values()
            for t in s.weights.values()
        )

    def state_dict(self) -> dict[str, Any]:
        """The pool for a checkpoint: tensors, ints and strings only
        (``torch.load(weights_only=True)`` reads it back)."""
        return {
            "config": dataclasses.asdict(self.config),
            "next_id": self._next_id,
            "last_step": self._last_step,
            "snapshots": [
                {
                    "id": i,
                    "learner_step": s.learner_step,
                    "weights": s.weights,
                    "results": list(s.results),
                }
                for i, s in self._snapshots.items()
            ],
            "fixed": [
                {"name": self.fixed_name(i), "results": list(r)} for i, r in self._fixed.items()
            ],
            "rng": self._rng.bit_generator.state,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a pool saved by :meth:`state_dict`. This run's config rules: a smaller
        ``pool_size`` evicts the oldest snapshots at once; fixed opponents this run names
        keep their results by name, others are dropped."""
        self._snapshots = {
            int(s["id"]): _Snapshot(
                int(s["learner_step"]),
                {k: v.detach().to("cpu") for k, v in s["weights"].items()},
                [int(n) for n in s["results"]],
            )
            for s in state["snapshots"]
        }
        self._next_id = int(state["next_id"])
        last = state["last_step"]
        self._last_step = None if last is None else int(last)
        self._rng.bit_generator.state = state["rng"]
        while len(self._snapshots) > self.config.pool_size:
            del self._snapshots[next(iter(self._snapshots))]
        saved = {f["name"]: f["results"] for f in state.get("fixed", [])}
        for i in self._fixed:  # results against an opponent this run still names
            self._fixed[i] = [int(n) for n in saved.get(self.fixed_name(i), [0, 0, 0])]

    def _get(self, snapshot_id: int) -> _Snapshot:
        try:
            return self._snapshots[snapshot_id]
        except KeyError:
            raise KeyError(
                f"snapshot {snapshot_id} is not in the pool (kept: {self.ids()})"
            ) from None


_INDEX = {Outcome.WIN: 0, Outcome.DRAW: 1, Outcome.LOSS: 2}
