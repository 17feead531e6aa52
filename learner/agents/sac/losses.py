"""SAC's targets and losses as pure functions, and the Polyak update of the target critics.

Row ``t`` of a sequence holds the observation and the reward and flags that came with it
(R2D2's layout, :mod:`learner.agents.r2d2.targets`); transition ``t -> t+1`` is real only
when row ``t`` ends no episode, and the losses weight the others out.

Shape suffixes: T transitions (T + 1 rows), B sequences.
"""

from __future__ import annotations

import torch
from torch import nn

from learner.agents.r2d2.targets import n_step_returns


def soft_q_targets(
    reward_T1B: torch.Tensor,
    terminated_T1B: torch.Tensor,
    truncated_T1B: torch.Tensor,
    next_q_T1B: torch.Tensor,
    next_logp_T1B: torch.Tensor,
    alpha: torch.Tensor | float,
    discount: float,
    n: int,
) -> torch.Tensor:
    """Soft n-step targets ``[T, B]``, without gradient:
    y_t = sum_{k<m} gamma^k r_{t+1+k} + gamma^m (Q'(s_{t+m}, a') - alpha log pi(a'|s_{t+m}))
    with a' the policy's sample at row t+m, Q' the smaller target critic, and no bootstrap
    term when row t+m terminated."""
    with torch.no_grad():
        soft_value_T1B = next_q_T1B - alpha * next_logp_T1B
        return n_step_returns(
            reward_T1B, terminated_T1B, truncated_T1B, soft_value_T1B, discount, n
        )


def critic_loss(
    q1_TB: torch.Tensor,
    q2_TB: torch.Tensor,
    target_TB: torch.Tensor,
    weight_TB: torch.Tensor,
    count: torch.Tensor,
) -> torch.Tensor:
    """Both critics' weighted squared errors, 0.5 (y - Q1)^2 + 0.5 (y - Q2)^2, summed over
    the transitions and divided by ``count`` (the real ones)."""
    squared_TB = (target_TB - q1_TB).square() + (target_TB - q2_TB).square()
    return 0.5 * (squared_TB * weight_TB).sum() / count


def temperature_loss(
    log_alpha: torch.Tensor,
    logp_TB: torch.Tensor,
    target_entropy: float,
    weight_TB: torch.Tensor,
    count: torch.Tensor,
) -> torch.Tensor:
    """J(alpha) = E[-alpha (log pi(a|s) + target entropy)]: its gradient raises alpha
    while the policy's entropy (-log pi) is below the target and lowers it above."""
    return (-log_alpha.exp() * (logp_TB.detach() + target_entropy) * weight_TB).sum() / count


def polyak_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """target <- tau * online + (1 - tau) * target, parameter by parameter, in place."""
    with torch.no_grad():
        dst: list[torch.Tensor] = list(target.parameters())
        src: list[torch.Tensor] = list(online.parameters())
        torch._foreach_lerp_(dst, src, tau)
