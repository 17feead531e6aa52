"""The optimizer recipe every agent builds its optimizers with: Adam as the config sets it."""

from __future__ import annotations

import torch

from seedrl.config import LearnerConfig


def make_optimizer(module: torch.nn.Module, config: LearnerConfig) -> torch.optim.Optimizer:
    """Adam over the module's parameters, as ``config`` sets it."""
    # The fused kernel updates every parameter in one op, where the default pays per-op
    # overhead per parameter, which dominates for the small models here.
    fused = next(module.parameters()).device.type in ("cpu", "cuda")
    return torch.optim.Adam(
        module.parameters(), lr=config.learning_rate, eps=config.adam_eps, fused=fused
    )


def apply_optimizer_settings(optimizer: torch.optim.Optimizer, config: LearnerConfig) -> None:
    """Set the configured learning rate and epsilon on every parameter group.

    ``load_state_dict`` brings back the hyper-parameters a checkpoint was saved with, so
    without this a resumed run would ignore ``--learning-rate`` (and a run saved before
    the defaults changed would keep the old rate with the new batch).
    """
    for group in optimizer.param_groups:
        group["lr"] = config.learning_rate
        group["eps"] = config.adam_eps
