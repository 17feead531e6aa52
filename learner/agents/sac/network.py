"""SAC's networks: a squashed-Gaussian actor (the one inference runs) and twin Q critics.

Both read observations through the shipped encoders (:class:`TorsoCore`: an MLP over flat
observations, a CNN over images, one encoder per leaf of a dict/tuple observation); on a
flat observation each network is a ReLU MLP of ``--hidden-sizes`` from the raw input, as
in the SAC paper, and a critic reads the action beside the observation there.

Shape suffixes: T time, B batch, N = T * B rows, O observation dims, A action dims.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from learner.agents.models import LOG_STD_MAX, LOG_STD_MIN, CoreState, ModelSpec, TorsoCore

SAC_LOG_STD_MIN = max(LOG_STD_MIN, -5.0)
SAC_LOG_STD_MAX = min(LOG_STD_MAX, 2.0)
"""The range the actor's state-dependent log-std is squashed into (smoothly: a clamp
would stop the gradient at its edges)."""


def relu_mlp(in_size: int, hidden_sizes: tuple[int, ...]) -> tuple[nn.Sequential, int]:
    """Linear + ReLU layers and their output width."""
    layers: list[nn.Module] = []
    size = in_size
    for width in hidden_sizes:
        layers += [nn.Linear(size, width), nn.ReLU()]
        size = width
    return nn.Sequential(*layers), size


class _Encoded(TorsoCore):
    """A feed-forward network on the shipped encoders: ``hidden`` ReLU layers on a flat
    observation (plus ``extra`` inputs), the encoder then the layers on any other."""

    def __init__(self, spec: ModelSpec, extra: int) -> None:
        if spec.lstm_size:
            raise ValueError("--agent sac trains feed-forward networks (no --lstm)")
        super().__init__(spec)
        self.core = None
        if spec.torso == "mlp":
            self.torso, features = nn.Identity(), math.prod(spec.obs_shape)
        else:
            features = self._build_torso(spec)
        self.hidden, self.feature_size = relu_mlp(features + extra, spec.hidden_sizes)

    def encode(self, obs_NO: torch.Tensor) -> torch.Tensor:
        return self.torso(self._prepare(obs_NO))


class SquashedGaussianActor(_Encoded):
    """Observations -> the pre-squash mean and a state-dependent log-std ``[T, B, 2A]``."""

    masked = False
    """No action mask: what an exporter asks of any agent network."""

    def __init__(self, spec: ModelSpec) -> None:
        if not spec.continuous or not spec.action_low:
            raise ValueError("a squashed-Gaussian actor needs a bounded Box action space")
        super().__init__(spec, extra=0)
        self.policy = nn.Linear(self.feature_size, spec.param_size)

    def forward(
        self, obs_TBO: torch.Tensor, first_TB: torch.Tensor, core_state: CoreState = ()
    ) -> tuple[torch.Tensor, CoreState]:
        return self.act(obs_TBO, first_TB, core_state)

    def act(
        self, obs_TBO: torch.Tensor, first_TB: torch.Tensor, core_state: CoreState = ()
    ) -> tuple[torch.Tensor, CoreState]:
        """Policy parameters and (empty) core state: what inference, the loss and an
        exporter read."""
        t, b = obs_TBO.shape[:2]
        features = self.encode(obs_TBO.reshape(t * b, *obs_TBO.shape[2:]))
        return self.policy_params(features, t, b), core_state

    def policy_params(
        self, features: torch.Tensor, t: int, b: int, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The parameters ``[T, B, 2A]`` of the encoder's features."""
        mean, raw_log_std = self.policy(self.hidden(features)).reshape(t, b, -1).chunk(2, dim=-1)
        span = SAC_LOG_STD_MAX - SAC_LOG_STD_MIN
        log_std = SAC_LOG_STD_MIN + 0.5 * span * (torch.tanh(raw_log_std) + 1.0)
        return torch.cat([mean, log_std], dim=-1)


class QCritic(_Encoded):
    """(observation, action) -> Q ``[N]``."""

    def __init__(self, spec: ModelSpec, action_size: int) -> None:
        super().__init__(spec, extra=action_size)
        self.value = nn.Linear(self.feature_size, 1)

    def forward(self, obs_NO: torch.Tensor, action_NA: torch.Tensor) -> torch.Tensor:
        inputs = torch.cat([self.encode(obs_NO), action_NA.flatten(1).float()], dim=-1)
        return self.value(self.hidden(inputs)).squeeze(-1)


class TwinQ(nn.Module):
    """Two independent critics (clipped double Q: the target takes their minimum)."""

    def __init__(self, spec: ModelSpec, action_size: int) -> None:
        super().__init__()
        self.q1 = QCritic(spec, action_size)
        self.q2 = QCritic(spec, action_size)

    def forward(
        self, obs_TBO: torch.Tensor, action_TBA: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Both critics' Q ``[T, B]`` of each row's observation and action."""
        t, b = obs_TBO.shape[:2]
        obs_NO = obs_TBO.reshape(t * b, *obs_TBO.shape[2:])
        action_NA = action_TBA.reshape(t * b, -1)
        return self.q1(obs_NO, action_NA).reshape(t, b), self.q2(obs_NO, action_NA).reshape(t, b)


class Temperature(nn.Module):
    """The entropy temperature alpha, learned as its log (so it stays positive)."""

    def __init__(self, initial: float) -> None:
        super().__init__()
        self.log_alpha = nn.Parameter(torch.tensor(math.log(initial), dtype=torch.float32))

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.exp()
