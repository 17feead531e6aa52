"""R2D2's learning targets (Kapturowski et al. 2019): the invertible value rescaling and
n-step double-Q targets over a time-major sequence, as pure functions.

Row ``t`` of a sequence holds the observation, and the reward and terminated/truncated
flags that came *with* it (the outcome of the action at row ``t - 1``). Transition
``t -> t+1`` is real only when row ``t`` ends no episode; the one that does (final
observation -> reset observation) is masked. The n-step window of transition ``t`` sums
the rewards of rows ``t+1..t+m`` and stops at the first episode end, the n-th step or the
sequence's last row, whichever is first: a *terminated* row there contributes no
bootstrap (discount 0), a *truncated* one bootstraps from its final observation.

Shape suffixes: T transitions (the sequence has T + 1 rows), B sequences, A actions.
"""

from __future__ import annotations

import torch


def value_rescale(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x: squashes large returns so one network
    fits values of very different scales."""
    return torch.sign(x) * (torch.sqrt(x.abs() + 1.0) - 1.0) + eps * x


def inverse_value_rescale(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """h^-1(x), the closed-form inverse of :func:`value_rescale` (Pohlen et al. 2018)."""
    root = (torch.sqrt(1.0 + 4.0 * eps * (x.abs() + 1.0 + eps)) - 1.0) / (2.0 * eps)
    return torch.sign(x) * (root.square() - 1.0)


def valid_transitions(terminated_T1B: torch.Tensor, truncated_T1B: torch.Tensor) -> torch.Tensor:
    """``[T, B]`` True where row t -> t+1 is a real transition (row t ends no episode)."""
    return ~(terminated_T1B[:-1] | truncated_T1B[:-1])


def n_step_double_q_targets(
    reward_T1B: torch.Tensor,
    terminated_T1B: torch.Tensor,
    truncated_T1B: torch.Tensor,
    online_q_T1BA: torch.Tensor,
    target_q_T1BA: torch.Tensor,
    discount: float,
    n: int,
    eps: float = 1e-3,
) -> torch.Tensor:
    """Rescaled n-step double-Q targets ``[T, B]`` of every transition (masked ones too:
    the caller weights them out), without gradient.

    target_t = h(sum_{k<m} gamma^k r_{t+1+k} + gamma^m h^-1(Q_target(s_{t+m}, a*))) with
    a* = argmax_a Q_online(s_{t+m}, a), and no bootstrap term when row t+m terminated.
    All inputs cover the sequence's T + 1 rows; Q values are in the rescaled space.
    """
    with torch.no_grad():
        greedy_T1B = online_q_T1BA.argmax(dim=-1, keepdim=True)
        bootstrap_T1B = inverse_value_rescale(
            target_q_T1BA.gather(-1, greedy_T1B).squeeze(-1).float(), eps
        )
        return value_rescale(
            n_step_returns(reward_T1B, terminated_T1B, truncated_T1B, bootstrap_T1B, discount, n),
            eps,
        )


def n_step_returns(
    reward_T1B: torch.Tensor,
    terminated_T1B: torch.Tensor,
    truncated_T1B: torch.Tensor,
    bootstrap_T1B: torch.Tensor,
    discount: float,
    n: int,
) -> torch.Tensor:
    """n-step returns ``[T, B]`` of every transition, without gradient:
    sum_{k<m} gamma^k r_{t+1+k} + gamma^m bootstrap_{t+m}, with no bootstrap term when row
    t+m terminated (the window's end as the module says). ``bootstrap_T1B``: each row's
    value estimate of its observation."""
    with torch.no_grad():
        t1 = reward_T1B.shape[0]
        last = t1 - 1
        done_T1B = terminated_T1B | truncated_T1B
        rows_TB = torch.arange(last, device=reward_T1B.device).unsqueeze(1).expand(last, -1)
        rows_TB = rows_TB.expand(last, reward_T1B.shape[1])
        total_TB = torch.zeros(rows_TB.shape, dtype=torch.float32, device=reward_T1B.device)
        scale_TB = torch.ones_like(total_TB)
        boot_scale_TB = torch.zeros_like(total_TB)
        boot_row_TB = rows_TB.clone()
        active_TB = torch.ones_like(total_TB, dtype=torch.bool)
        for k in range(1, n + 1):
            row_TB = (rows_TB + k).clamp(max=last)
            step_TB = active_TB & (rows_TB + k <= last)
            total_TB = total_TB + torch.where(
                step_TB, scale_TB * reward_T1B.gather(0, row_TB).float(), 0.0
            )
            scale_TB = scale_TB * discount
            stop_TB = step_TB & (done_T1B.gather(0, row_TB) | (k == n) | (row_TB == last))
            terminal_TB = terminated_T1B.gather(0, row_TB)
            boot_row_TB = torch.where(stop_TB, row_TB, boot_row_TB)
            boot_scale_TB = torch.where(
                stop_TB, torch.where(terminal_TB, 0.0, scale_TB), boot_scale_TB
            )
            active_TB = active_TB & ~stop_TB
        bootstrap_TB = bootstrap_T1B.float().gather(0, boot_row_TB)
        return total_TB + boot_scale_TB * bootstrap_TB


def sequence_priorities(
    abs_td_TB: torch.Tensor, weight_TB: torch.Tensor, eta: float, floor: float = 1e-6
) -> torch.Tensor:
    """``[B]`` priorities eta * max|td| + (1 - eta) * mean|td| over each sequence's
    trained transitions (``weight_TB`` 1 where trained); ``floor`` for one with none."""
    with torch.no_grad():
        masked_TB = abs_td_TB * weight_TB
        count_B = weight_TB.sum(dim=0)
        mean_B = masked_TB.sum(dim=0) / count_B.clamp(min=1.0)
        max_B = masked_TB.max(dim=0).values
        return (eta * max_B + (1.0 - eta) * mean_B).clamp(min=floor)
