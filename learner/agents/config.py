"""Knob sections several agents share: an agent's options class builds on one and keeps
its own defaults by redeclaring a knob with a new value (the knob keeps its docstring and
its place in ``--help`` and docs/configuration.md). It imports no torch: a config
section is data."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from seedrl.config import AgentOptions, LearnerConfig, require_range


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReplayOptions(AgentOptions):
    """The replay an off-policy agent keeps on the learner
    (:func:`learner.agents.r2d2.replay.replay_for` builds it from these knobs). The knobs
    without a default here differ between agents: each agent's options give them."""

    replay: ClassVar[bool] = True

    # replay (kept on the learner)
    replay_frames: int = 1_000_000
    """Replay capacity in stored frames (sequences x rows); the oldest go first."""
    replay_bytes: int = 8 * 1024**3
    """Replay capacity in bytes of stored sequences (Atari frames stored once)."""
    replay_min_frames: int
    """Stored frames before the first learner step."""
    replay_ratio: float
    """Trained frames (sampled sequences x --unroll-length) per inserted frame; the
    learner waits rather than exceed it (0: no limit)."""
    replay_hold_actors: bool = True
    """Hold inference, and so the actors, back while the trainer is behind
    --replay-ratio by more than the minimum fill and two batches, so a run trains at the
    asked ratio on a slow learner too; off: actors run free and a slow trainer trains on
    fewer samples per frame."""
    priority_exponent: float
    """Alpha, sequences are sampled in proportion to priority ** alpha (0: uniform)."""
    importance_exponent: float
    """Beta of the importance weights (N * P(i)) ** -beta, normalised by their max."""
    priority_eta: float = 0.9
    """A sequence's priority is eta * max|td| + (1 - eta) * mean|td|."""

    def check(self, config: LearnerConfig) -> None:
        require_range(self, ("replay_frames", "replay_bytes"), low=1)
        require_range(self, ("replay_min_frames", "replay_ratio", "importance_exponent"), low=0)
        require_range(self, ("priority_exponent", "priority_eta"), low=0, high=1)
