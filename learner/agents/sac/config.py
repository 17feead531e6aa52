"""SAC's own knobs: the ``--agent sac`` section of the learner's config."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from learner.agents.config import ReplayOptions
from seedrl.config import LearnerConfig, require_range


@dataclasses.dataclass(frozen=True)
class SACOptions(ReplayOptions):
    """SAC (soft actor-critic): the squashed-Gaussian actor's temperature, the twin
    critics' targets and the replay they train from (uniform unless
    --priority-exponent > 0); Box actions with finite bounds. Its gradients are not
    clipped (--max-grad-norm does not apply), as in seed_rl's and CleanRL's SAC."""

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
    """The critics' Adam rate as a multiple of --learning-rate (the actor's)."""
    temperature_learning_rate_scale: float = 1.0
    """The temperature's Adam rate as a multiple of --learning-rate (the actor's)."""
    policy_frequency: int = 1
    """Delayed policy updates: the actor and the temperature step k times on every k-th
    update, the critics on every one, so both take one step per update on average and the
    actor follows critics that have had k steps since its last."""
    replay_min_frames: int = 5_000
    replay_ratio: float = 32.0
    priority_exponent: float = 0.0  # uniform sampling, as CleanRL's SAC
    importance_exponent: float = 0.0

    def check(self, config: LearnerConfig) -> None:
        super().check(config)
        require_range(self, ("n_step", "policy_frequency"), low=1)
        rates = ("critic_learning_rate_scale", "temperature_learning_rate_scale")
        require_range(self, ("initial_temperature", *rates), low=0, low_open=True)
        require_range(self, ("target_smoothing",), low=0, high=1, low_open=True)
        require_range(self, ("target_entropy_scale",), low=0)
        if config.lstm:
            raise ValueError("--agent sac trains feed-forward networks: drop --lstm")
        if config.inference_backend == "numpy":  # the squash and its std are torch's only
            raise ValueError("--agent sac samples its actions in torch: --inference-backend auto")
