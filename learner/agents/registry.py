"""The agents ``--agent`` can name: one table, one entry per learning algorithm."""

from __future__ import annotations

from collections.abc import Callable

import torch

from learner.agents.base import Agent
from learner.agents.r2d2 import R2D2Agent
from learner.agents.vtrace import VTraceAgent
from seedrl.config import LearnerConfig
from seedrl.proto import seedrl_pb2 as pb

AgentFactory = Callable[[LearnerConfig, pb.SpaceSpec, torch.device, bool], Agent]

AGENTS: dict[str, AgentFactory] = {
    VTraceAgent.name: VTraceAgent,
    R2D2Agent.name: R2D2Agent,
}
"""``--agent`` name -> the agent's factory (its config, the env's action space, the device)."""


def make_agent(
    config: LearnerConfig, action_space: pb.SpaceSpec, device: torch.device, masked: bool = False
) -> Agent:
    """The agent ``--agent`` names, for an env's action space on ``device`` (``masked``: the
    observation carries an action mask, see ``--action-mask``)."""
    try:
        factory = AGENTS[config.agent]
    except KeyError:
        raise ValueError(f"unknown agent {config.agent!r}; choose from {sorted(AGENTS)}") from None
    return factory(config, action_space, device, masked)
