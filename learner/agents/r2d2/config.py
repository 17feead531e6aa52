"""R2D2's own knobs: the ``--agent r2d2`` section of the learner's config."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from learner.agents.config import ReplayOptions
from seedrl.config import LearnerConfig, require_range


@dataclasses.dataclass(frozen=True)
class R2D2Options(ReplayOptions):
    """R2D2 (recurrent replay distributed DQN): the sequences its prioritized replay keeps,
    its n-step double-Q target and the per-slot epsilon-greedy ladder; discrete actions."""

    continuous_actions: ClassVar[bool] = False

    burn_in: int = 40
    """Rows at the start of each replayed sequence that only unroll the LSTM from
    its stored state (no gradient); --unroll-length transitions follow them."""
    sequence_overlap: int = 40
    """Rows a slot's consecutive sequences share (besides the bootstrap frame); equal
    to --burn-in, every transition is trained in exactly one sequence."""
    n_step: int = 5
    """Steps of the n-step double-Q target."""
    target_update_interval: int = 2500
    """Optimizer steps between copies of the online network into the target one."""
    value_rescale_eps: float = 1e-3
    """Epsilon of the invertible value rescaling h(x) = sign(x)(sqrt(|x|+1)-1)+eps*x."""
    epsilon: float = 0.4
    """Ape-X base epsilon; slot i explores with epsilon ** (1 + alpha * i / (N - 1))."""
    epsilon_alpha: float = 7.0
    """Ape-X alpha of the per-slot epsilon ladder."""
    epsilon_slots: int = 0
    """N, rungs of a fixed epsilon ladder, trajectory slot s on rung s mod N; 0: the
    ladder spans the env slots handed out so far, however many actors connect (a fixed
    ladder longer than the slots leaves its near-greedy rungs unused)."""
    replay_min_frames: int = 20_000
    replay_ratio: float = 1.0
    priority_exponent: float = 0.9  # Ape-X's prioritized sampling
    importance_exponent: float = 0.6

    def check(self, config: LearnerConfig) -> None:
        super().check(config)
        require_range(self, ("n_step", "target_update_interval"), low=1)
        require_range(
            self,
            ("burn_in", "sequence_overlap", "epsilon_alpha", "value_rescale_eps", "epsilon_slots"),
            low=0,
        )
        require_range(self, ("epsilon",), low=0, high=1)
        if self.sequence_overlap > self.burn_in + config.unroll_length - 1:
            raise ValueError(
                f"--sequence-overlap ({self.sequence_overlap}) must leave a sequence at least one"
                f" new row (<= --burn-in + --unroll-length - 1)"
            )
