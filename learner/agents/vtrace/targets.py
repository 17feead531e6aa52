"""V-trace off-policy value targets and policy-gradient advantages.

Implements the V-trace operator from IMPALA (Espeholt et al. 2018, eq. 1 and section 4.2).
The learner trains on trajectories produced by slightly stale actor policies; V-trace corrects
for that lag with truncated importance weights and yields:

* ``vs``: the value targets v_s for the baseline (critic) loss, and
* ``pg_advantages``: rho_s * (r_s + gamma_s * v_{s+1} - V(x_s)) for the policy-gradient loss.

Everything is computed without gradients: the outputs are regression / advantage targets.

All tensors are time-major. Shape suffixes used in names and docstrings:

* ``T``: time (unroll length); index 0 is the oldest step.
* ``B``: batch (number of trajectories).
* ``...``: optional extra trailing dimensions, treated element-wise.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch


class VTraceReturns(NamedTuple):
    """V-trace outputs, both ``[T, B, ...]`` and detached."""

    vs: torch.Tensor
    pg_advantages: torch.Tensor


def _check_inputs(
    log_rhos: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
) -> None:
    """Raise ValueError unless the inputs have consistent time-major shapes."""
    if values.dim() < 2:
        raise ValueError(f"values must be at least rank 2 ([T, B, ...]), got shape {values.shape}")
    if values.shape[0] < 1:
        raise ValueError(f"values must have at least one time step, got shape {values.shape}")
    if bootstrap_value.dim() != values.dim() - 1:
        raise ValueError(
            "bootstrap_value rank must be values rank - 1: got bootstrap_value shape "
            f"{bootstrap_value.shape} and values shape {values.shape}"
        )
    if bootstrap_value.shape != values.shape[1:]:
        raise ValueError(
            "bootstrap_value shape must equal values shape without the time dimension: got "
            f"bootstrap_value shape {bootstrap_value.shape} and values shape {values.shape}"
        )
    for name, tensor in (("log_rhos", log_rhos), ("discounts", discounts), ("rewards", rewards)):
        if tensor.dim() != values.dim():
            raise ValueError(
                f"{name} rank must equal values rank: got {name} shape {tensor.shape} and "
                f"values shape {values.shape}"
            )
        if tensor.shape[:2] != values.shape[:2]:
            raise ValueError(
                f"{name} [T, B] must agree with values: got {name} shape {tensor.shape} and "
                f"values shape {values.shape}"
            )
        # Same rank: it broadcasts to values' shape iff each dim matches or is 1 (plain
        # ints; torch.broadcast_shapes runs symbolic-shape machinery on every call).
        if any(t != v and t != 1 for t, v in zip(tensor.shape, values.shape, strict=True)):
            raise ValueError(
                f"{name} shape {tensor.shape} must broadcast to values shape {values.shape}"
            )
        if tensor.device != values.device:
            raise ValueError(
                f"{name} is on device {tensor.device} but values is on device {values.device}"
            )
    if bootstrap_value.device != values.device:
        raise ValueError(
            f"bootstrap_value is on device {bootstrap_value.device} but values is on device "
            f"{values.device}"
        )


def from_importance_weights(
    log_rhos: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    lambda_: float = 1.0,
) -> VTraceReturns:
    """Compute V-trace value targets and policy-gradient advantages.

    Off-policy correction lets the learner use trajectories from lagging actor policies:
    truncated importance weights keep the targets' variance bounded while still converging to
    (a policy close to) the learner policy's value function.

    Args:
        log_rhos: ``[T, B, ...]`` log(pi(a|x) / mu(a|x)), target over behaviour policy.
            ``-inf`` is allowed and makes that step contribute nothing (used for masking).
        discounts: ``[T, B, ...]`` per-step discount gamma_t; 0 at episode terminations.
        rewards: ``[T, B, ...]`` rewards r_t.
        values: ``[T, B, ...]`` baseline estimates V(x_t).
        bootstrap_value: ``[B, ...]`` value estimate V(x_T) after the last step.
        clip_rho_threshold: truncation rho-bar for the value targets (None: no clipping).
        clip_pg_rho_threshold: truncation for the policy-gradient weights (None: no clipping).
        lambda_: trace-cutting factor; c_t = lambda_ * min(1, rho_t).

    Returns:
        VTraceReturns(vs, pg_advantages), both ``[T, B, ...]``, detached.

    Raises:
        ValueError: if ranks or shapes are inconsistent.
    """
    _check_inputs(log_rhos, discounts, rewards, values, bootstrap_value)
    inputs = (log_rhos, discounts, rewards, values, bootstrap_value)
    if all(t.device.type == "cpu" and t.dtype in NUMPY_DTYPES for t in inputs):
        arrays = [t.detach().numpy() for t in inputs]
        return _from_importance_weights_numpy(
            arrays[0], arrays[1], arrays[2], arrays[3], arrays[4],
            clip_rho_threshold, clip_pg_rho_threshold, lambda_,
        )  # fmt: skip
    return _from_importance_weights_torch(
        *inputs, clip_rho_threshold, clip_pg_rho_threshold, lambda_
    )


def _from_importance_weights_torch(
    log_rhos: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    clip_rho_threshold: float | None,
    clip_pg_rho_threshold: float | None,
    lambda_: float,
) -> VTraceReturns:
    """:func:`from_importance_weights` in torch ops, on any device (checked inputs)."""
    with torch.no_grad():
        rhos_TB = torch.exp(log_rhos)
        if clip_rho_threshold is not None:
            clipped_rhos_TB = torch.clamp(rhos_TB, max=clip_rho_threshold)
        else:
            clipped_rhos_TB = rhos_TB
        cs_TB = lambda_ * torch.clamp(rhos_TB, max=1.0)

        values_t_plus_1_TB = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
        deltas_TB = clipped_rhos_TB * (rewards + discounts * values_t_plus_1_TB - values)
        # Broadcast so every step has the full [B, ...] shape before the recursion.
        deltas_TB, decay_TB = torch.broadcast_tensors(deltas_TB, discounts * cs_TB)

        # acc_t = delta_t + gamma_t * c_t * acc_{t+1}, acc_T = 0: one fused op per step
        # (the loop's per-op overhead, not arithmetic, is its cost at learner batch sizes).
        acc_B = torch.zeros_like(deltas_TB[0])
        accs_B = []
        steps = zip(deltas_TB.unbind(0), decay_TB.unbind(0), strict=True)
        for delta_B, decay_B in reversed(list(steps)):
            acc_B = torch.addcmul(delta_B, decay_B, acc_B)
            accs_B.append(acc_B)
        vs_TB = values + torch.stack(accs_B[::-1])

        vs_t_plus_1_TB = torch.cat([vs_TB[1:], bootstrap_value.unsqueeze(0)], dim=0)
        if clip_pg_rho_threshold is not None:
            clipped_pg_rhos_TB = torch.clamp(rhos_TB, max=clip_pg_rho_threshold)
        else:
            clipped_pg_rhos_TB = rhos_TB
        pg_advantages_TB = clipped_pg_rhos_TB * (rewards + discounts * vs_t_plus_1_TB - values)

    return VTraceReturns(vs=vs_TB.detach(), pg_advantages=pg_advantages_TB.detach())


NUMPY_DTYPES = (torch.float32, torch.float64)


def _from_importance_weights_numpy(
    log_rhos: np.ndarray,
    discounts: np.ndarray,
    rewards: np.ndarray,
    values: np.ndarray,
    bootstrap_value: np.ndarray,
    clip_rho_threshold: float | None,
    clip_pg_rho_threshold: float | None,
    lambda_: float,
) -> VTraceReturns:
    """:func:`from_importance_weights` for CPU tensors, computed in numpy on their memory.

    Why: at a learner's batch the arrays are a few thousand numbers, and the torch
    version's cost is its per-op dispatch (one op per time step in the recursion), not
    arithmetic; numpy's per-op cost is a fraction of it. Same operations, same dtypes.
    """
    rhos = np.exp(log_rhos)
    clipped_rhos = rhos if clip_rho_threshold is None else np.minimum(rhos, clip_rho_threshold)
    cs = lambda_ * np.minimum(rhos, 1.0)
    values_t_plus_1 = np.concatenate([values[1:], bootstrap_value[None]], axis=0)
    deltas = clipped_rhos * (rewards + discounts * values_t_plus_1 - values)
    deltas, decay = np.broadcast_arrays(deltas, discounts * cs)
    # acc_t = delta_t + gamma_t * c_t * acc_{t+1}, acc_T = 0, written in place row by row.
    accs = np.empty(deltas.shape, deltas.dtype)
    acc = np.zeros(deltas.shape[1:], deltas.dtype)
    for t in range(len(deltas) - 1, -1, -1):
        np.multiply(decay[t], acc, out=acc)
        np.add(deltas[t], acc, out=acc)
        accs[t] = acc
    vs = values + accs
    vs_t_plus_1 = np.concatenate([vs[1:], bootstrap_value[None]], axis=0)
    pg_rhos = rhos if clip_pg_rho_threshold is None else np.minimum(rhos, clip_pg_rho_threshold)
    pg_advantages = pg_rhos * (rewards + discounts * vs_t_plus_1 - values)
    return VTraceReturns(vs=torch.from_numpy(vs), pg_advantages=torch.from_numpy(pg_advantages))
