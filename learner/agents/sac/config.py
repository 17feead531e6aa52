"""SAC's own knobs: the ``--agent sac`` section of the learner's config."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from seedrl.config import AgentOptions, LearnerConfig, require_range


@dataclasses.dataclass(frozen=True)
class SACOptions(AgentOptions):
    """SAC (soft actor-critic): the squashed-Gaussian actor's temperature, the twin
    critics' targets and the replay they train from (uniform unless
    --priority-exponent > 0); Box actions with finite bounds."""

    replay: ClassVar[bool] = True
    continuous_actions: ClassVar[bool] = True

    n_step: int = 1
    """Steps of the soft Q target (a window stops at an episode end or the unroll's
    last row)."""
    target_smoothing: float = 0.005
    """Tau of the Polyak average target <- tau * online + (1 - tau) * target, after
    every critic step."""
    initial_temperature: float = 1.0
    """Alpha, the entropy bonus's weight, at the start."""
    learn_temperature: bool = True
    """Tune alpha so the policy's entropy tracks --target-entropy-scale x -|A|; off:
    alpha stays at --initial-temperature."""
    target_entropy_scale: float = 1.0
    """The target entropy is -scale x |A| (the action dimensions)."""
    critic_learning_rate_scale: float = 1.0
    """The critics' Adam rate as a multiple of --learning-rate (the actor's and the
    temperature's)."""
    replay_frames: int = 1_000_000
    """Replay capacity in stored frames (sequences x rows); the oldest go first."""
    replay_bytes: int = 8 * 1024**3
    """Replay capacity in bytes of stored sequences (Atari frames stored once)."""
    replay_min_frames: int = 5_000
    """Stored frames before the first learner step."""
    replay_ratio: float = 32.0
    """Trained frames (sampled sequences x --unroll-length) per inserted frame; the
    learner waits rather than exceed it (0: no limit)."""
    replay_hold_actors: bool = True
    """Hold inference, and so the actors, back while the trainer is behind
    --replay-ratio by more than the minimum fill and two batches, so a run trains at the
    asked ratio on a slow learner too; off: actors run free and a slow trainer trains on
    fewer samples per frame."""
    priority_exponent: float = 0.0
    """Alpha, sequences are sampled in proportion to priority ** alpha (0: uniform)."""
    importance_exponent: float = 0.0
    """Beta of the importance weights (N * P(i)) ** -beta, normalised by their max."""
    priority_eta: float = 0.9
    """A sequence's priority is eta * max|td| + (1 - eta) * mean|td|."""

    def check(self, config: LearnerConfig) -> None:
        require_range(self, ("n_step", "replay_frames", "replay_bytes"), low=1)
        require_range(self, ("replay_min_frames", "replay_ratio", "importance_exponent"), low=0)
        require_range(
            self, ("initial_temperature", "critic_learning_rate_scale"), low=0, low_open=True
        )
        require_range(self, ("target_smoothing",), low=0, high=1, low_open=True)
        require_range(self, ("priority_exponent", "priority_eta"), low=0, high=1)
        require_range(self, ("target_entropy_scale",), low=0)
        if config.lstm:
            raise ValueError("--agent sac trains feed-forward networks: drop --lstm")
        if config.inference_backend == "numpy":  # the squash and its std are torch's only
            raise ValueError("--agent sac samples its actions in torch: --inference-backend auto")
