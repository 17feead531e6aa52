"""The agents ``--agent`` can name: one table, one entry per learning algorithm."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from learner.agents.base import Agent, AgentState
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


def agent_factory(config: LearnerConfig) -> AgentFactory:
    """The factory of the agent ``--agent`` names."""
    try:
        return AGENTS[config.agent]
    except KeyError:
        raise ValueError(f"unknown agent {config.agent!r}; choose from {sorted(AGENTS)}") from None


def make_agent(
    config: LearnerConfig, action_space: pb.SpaceSpec, device: torch.device, masked: bool = False
) -> Agent:
    """The agent ``--agent`` names, for an env's action space on ``device`` (``masked``: the
    observation carries an action mask, see ``--action-mask``)."""
    return agent_factory(config)(config, action_space, device, masked)


@dataclass(frozen=True)
class AgentRecipe:
    """How to build a learner's agent and a fresh state of it again, in another process:
    picklable (the factory travels by reference, the spaces as bytes), and it holds what
    the learner worked out once (the spaces the network sees, its torso, the mask)."""

    factory: AgentFactory
    config: LearnerConfig
    action_space: bytes
    observation_space: bytes
    """As the network sees it (normalized observations are float32)."""
    torso: str
    masked: bool

    @classmethod
    def of(
        cls,
        config: LearnerConfig,
        action_space: pb.SpaceSpec,
        observation_space: pb.SpaceSpec,
        torso: str,
        masked: bool,
    ) -> AgentRecipe:
        return cls(
            agent_factory(config), config, action_space.SerializeToString(),
            observation_space.SerializeToString(), torso, masked,
        )  # fmt: skip

    def agent(self, device: torch.device) -> Agent:
        return self.factory(
            self.config, pb.SpaceSpec.FromString(self.action_space), device, self.masked
        )

    def build(self, device: torch.device) -> tuple[Agent, AgentState]:
        """The agent and a fresh state of it on ``device``."""
        agent = self.agent(device)
        return agent, agent.build(pb.SpaceSpec.FromString(self.observation_space), self.torso)
