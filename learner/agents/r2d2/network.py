"""R2D2's network: a recurrent dueling Q-network (Wang et al. 2016).

Shape suffixes: T time, B batch, A actions.
"""

from __future__ import annotations

import torch
from torch import nn

from learner.agents.models import CoreState, ModelSpec, TorsoCore


class QNetwork(TorsoCore):
    """Torso -> optional LSTM core -> Q-values ``Q = V + A - mean(A)`` per action.

    The advantage layer is ``policy`` and the value layer ``baseline``: the parameter
    names (and order) of the actor-critic R2D2 trained before it had a network of its
    own, so its checkpoints load into this one as they are.
    """

    masked = False
    """No action mask (R2D2 refuses them): what an exporter asks of any agent network."""

    def __init__(self, spec: ModelSpec) -> None:
        if not spec.dueling or spec.continuous:
            raise ValueError("a Q-network needs a dueling spec of a discrete action space")
        super().__init__(spec)
        torso_out = self._build_core(spec, self._build_torso(spec))
        self.policy = nn.Linear(torso_out, spec.param_size)
        """The advantage of each action."""
        self.baseline = nn.Linear(torso_out, 1)
        """The state's value."""
        nn.init.orthogonal_(self.policy.weight, gain=0.01)
        nn.init.zeros_(self.policy.bias)

    def forward(
        self, obs_TBO: torch.Tensor, first_TB: torch.Tensor, core_state: CoreState = ()
    ) -> tuple[torch.Tensor, CoreState]:
        """Q-values ``[T, B, A]`` and the core state after step T (``first_TB`` zeroes the
        LSTM state at an episode's first frame)."""
        return self.act(obs_TBO, first_TB, core_state)

    def act(
        self, obs_TBO: torch.Tensor, first_TB: torch.Tensor, core_state: CoreState = ()
    ) -> tuple[torch.Tensor, CoreState]:
        """Q-values and core state: what inference, the loss and an exporter read."""
        t, b = obs_TBO.shape[:2]
        _, features, core_state = self._features(obs_TBO, first_TB, core_state)
        return self.policy_params(features, t, b), core_state

    def policy_params(
        self, features: torch.Tensor, t: int, b: int, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The Q-values ``[T, B, A]`` of the heads' features: the advantages' mean is the
        value's, so the two streams are identifiable."""
        advantage_TBA = self.policy(features).reshape(t, b, -1)
        value_TB1 = self.baseline(features).reshape(t, b, 1)
        return value_TB1 + advantage_TBA - advantage_TBA.mean(dim=-1, keepdim=True)
