"""Test doubles for self-play's snapshots: a league whose opponents need no model.

:func:`self_play` is a two-player :class:`~learner.serving.selfplay.SelfPlay` over a real
league whose snapshots are :class:`RecordingSnapshots` (they hold members and record the
rows they act on) and whose chooser is :class:`ChooseThree` (every opponent move is 3,
so replies tell the snapshot's rows from the learning policy's).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class RecordingSnapshots:
    """Stands in for StackedModels: holds members, records the rows it acts on."""

    def __init__(self) -> None:
        self.held: dict[int, Any] = {}
        self.calls: list[np.ndarray] = []

    def __contains__(self, member: int) -> bool:
        return member in self.held

    def members(self) -> list[int]:
        return list(self.held)

    def add(self, member: int, weights: Any) -> None:
        self.held[member] = weights

    def remove(self, member: int) -> None:
        del self.held[member]

    def act(self, obs_BO: np.ndarray, member_B: np.ndarray) -> torch.Tensor:
        self.calls.append(np.array(obs_BO))
        return torch.zeros(len(obs_BO), 4)


class ChooseThree:
    """A chooser whose every action is 3: the replies tell the snapshot's moves apart."""

    def choose(self, params_BP: torch.Tensor, slot_B: np.ndarray | None = None) -> np.ndarray:
        return np.full(len(params_BP), 3, np.int64)


def self_play(seed: int = 0) -> tuple[Any, Any, list[np.ndarray]]:
    """(league, two-player self-play over it, the rows its snapshots acted on)."""
    from learner.league.league import League
    from learner.league.pool import PoolConfig
    from learner.serving.selfplay import SelfPlay

    league = League(PoolConfig(1000, 4, "latest"), seed)
    snapshots = RecordingSnapshots()
    play = SelfPlay(league, 2, 1000, snapshots, ChooseThree(), lambda: {}, seed)  # type: ignore[arg-type]
    return league, play, snapshots.calls
