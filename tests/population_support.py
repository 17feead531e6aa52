"""A population's checkpoint whose members each act one known way, for the tools that load
a policy from a checkpoint (evaluate, serve, export) to show which member they play."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from learner.parts import build_learner, save_checkpoint
from learner.state.trajectories import FinishedEpisodes
from seedrl.config import LearnerConfig

ENV = "Acrobot-v1"
"""Three actions: member k of three always chooses action k, so each can be told apart."""
MEMBERS = 3
BEST = 2
"""The member of the highest recent return, neither the first nor the last asked for."""
RETURNS = {"member0": [-400.0], "member1": [-300.0], "member2": [-100.0]}


def population_checkpoint(logdir: Path) -> Path:
    """A checkpoint of ``MEMBERS`` members, member k's policy outputting logits 1 for
    action k and 0 elsewhere whatever it sees, member ``BEST`` ranked best by its
    episodes' returns."""
    config = LearnerConfig(
        env=ENV, population=MEMBERS, logdir=str(logdir), seed=1, hidden_sizes=(16,),
        tensorboard=False, progress="off",
    )  # fmt: skip
    learner = build_learner(config)
    for index, (name, slot) in enumerate(learner.policies.items()):
        with torch.no_grad():
            slot.state.model.policy.weight.zero_()
            slot.state.model.policy.bias.copy_(torch.eye(MEMBERS)[index])
        returns = RETURNS[name]
        ended = FinishedEpisodes(np.array(returns, np.float32), np.full(len(returns), 10))
        slot.stats.on_batch(10 * len(returns), ended)
    save_checkpoint(learner)
    return config.checkpoint_path


def observations(count: int, seed: int = 0) -> np.ndarray:
    """``count`` observations of the env's shape, spread over its range."""
    return np.random.default_rng(seed).uniform(-1.0, 1.0, (count, 6)).astype(np.float32)
