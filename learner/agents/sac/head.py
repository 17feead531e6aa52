"""SAC's action head: a Gaussian squashed by tanh and scaled into the Box's bounds.

The policy parameters ``[..., 2A]`` are the pre-squash mean and log-std; an action is
``centre + half_range * tanh(u)`` with ``u ~ N(mean, std)``. Its log-probability carries
the change of variables of both the tanh and the affine scaling, so the entropy the
temperature tunes is the entropy of the actions the env receives.

Shape suffixes: A action dims, P policy parameters (2A).
"""

from __future__ import annotations

import math

import torch

from learner.agents.models import GaussianHead

TANH_EDGE = 1.0 - 1e-6
"""How close to +-1 a stored action's tanh may come before it is pulled back: atanh(+-1)
is infinite, and an env-bound action at its bound is common (clipped, or float32 rounding)."""


class SquashedGaussianHead(GaussianHead):
    """A tanh-squashed diagonal Gaussian over a bounded Box (finite ``low`` and ``high``)."""

    def __init__(
        self, action_shape: tuple[int, ...], low: tuple[float, ...], high: tuple[float, ...]
    ) -> None:
        super().__init__(action_shape, low, high)
        low_A = torch.tensor(low, dtype=torch.float32)
        high_A = torch.tensor(high, dtype=torch.float32)
        self.centre_A = (high_A + low_A) / 2
        self.half_range_A = (high_A - low_A) / 2
        self.log_scale = float(self.half_range_A.log().sum())
        """log |det| of the affine map from (-1, 1) onto the bounds."""

    def _affine(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.centre_A.to(like.device), self.half_range_A.to(like.device)

    def squash(self, u: torch.Tensor) -> torch.Tensor:
        """Pre-squash values ``[..., A]`` -> actions in the bounds, ``[..., A]``."""
        centre, half_range = self._affine(u)
        return centre + half_range * torch.tanh(u)

    def rsample_with_log_prob(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised sample ``[..., A]`` (flat) and its log-probability ``[...]``:
        what the actor and temperature losses differentiate through."""
        mean, log_std = self._split(params)
        noise = torch.randn_like(mean)
        u = mean + log_std.exp() * noise
        gaussian = (-0.5 * noise.square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        return self.squash(u), gaussian - self._log_jacobian(u)

    def _log_jacobian(self, u: torch.Tensor) -> torch.Tensor:
        # log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)), stable for large |u|.
        log_tanh_slope = 2.0 * (math.log(2.0) - u - torch.nn.functional.softplus(-2.0 * u))
        return log_tanh_slope.sum(-1) + self.log_scale

    def sample(self, params: torch.Tensor) -> torch.Tensor:
        mean, log_std = self._split(params)
        return self._shape(self.squash(mean + log_std.exp() * torch.randn_like(mean)))

    def greedy(self, params: torch.Tensor) -> torch.Tensor:
        """The squashed mean (what ``evaluate`` and an export act with)."""
        return self._shape(self.squash(self._split(params)[0]))

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """The log-density of env-bound ``actions`` (inverted through the squash)."""
        mean, log_std = self._split(params)
        centre, half_range = self._affine(mean)
        a = actions.reshape(mean.shape).to(mean.dtype)
        u = torch.atanh(((a - centre) / half_range).clamp(-TANH_EDGE, TANH_EDGE))
        z = (u - mean) / log_std.exp()
        gaussian = (-0.5 * z.square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        return gaussian - self._log_jacobian(u)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        """A one-sample estimate (a squashed Gaussian's entropy has no closed form)."""
        return -self.rsample_with_log_prob(params)[1]

    def params_layout(self) -> str:
        """What an exported ``params`` output holds, in words a runner can act on."""
        return (
            f"pre-squash mean ({self.action_size}) then log_std ({self.action_size}) of a "
            "diagonal Gaussian; the action is centre + half_range * tanh(mean) of the Box"
        )
