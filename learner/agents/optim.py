"""The optimizer recipe every agent builds its optimizers with: Adam as the config sets it."""

from __future__ import annotations

import torch

from seedrl.config import LearnerConfig

LR_SCALE = "lr_scale"
"""Parameter-group key: the group's rate as a multiple of the scheduled --learning-rate
(SAC's critics step faster than its actor). Kept in the optimizer's state, so a resumed
run keeps it; the trainer's schedule and :func:`apply_optimizer_settings` honour it."""


def make_optimizer(
    module: torch.nn.Module, config: LearnerConfig, lr_scale: float = 1.0
) -> torch.optim.Optimizer:
    """Adam over the module's parameters, as ``config`` sets it, at ``lr_scale`` times the
    configured rate."""
    # The fused kernel updates every parameter in one op, where the default pays per-op
    # overhead per parameter, which dominates for the small models here.
    fused = next(module.parameters()).device.type in ("cpu", "cuda")
    optimizer = torch.optim.Adam(
        module.parameters(), lr=config.learning_rate * lr_scale, eps=config.adam_eps, fused=fused
    )
    if lr_scale != 1.0:
        for group in optimizer.param_groups:
            group[LR_SCALE] = lr_scale
    return optimizer


def scaled_rate(group: dict[str, object], rate: float) -> float:
    """``rate`` as parameter group ``group`` takes it (its :data:`LR_SCALE`, default 1)."""
    scale = group.get(LR_SCALE, 1.0)
    return rate * float(scale) if isinstance(scale, (int, float)) else rate


def apply_optimizer_settings(optimizer: torch.optim.Optimizer, config: LearnerConfig) -> None:
    """Set the configured learning rate and epsilon on every parameter group.

    ``load_state_dict`` brings back the hyper-parameters a checkpoint was saved with, so
    without this a resumed run would ignore ``--learning-rate`` (and a run saved before
    the defaults changed would keep the old rate with the new batch).
    """
    for group in optimizer.param_groups:
        group["lr"] = scaled_rate(group, config.learning_rate)
        group["eps"] = config.adam_eps
