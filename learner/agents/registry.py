"""The agents ``--agent`` can name: one table, one entry per learning algorithm.

An entry is the agent's factory and its options class (its own knobs, declared in its
package's ``config.py``); the learner's config learns the knobs from here
(:func:`seedrl.config.set_agent_catalog`), so a new agent is its package and one line.

It imports no torch: a shipped agent's factory is :class:`Lazy`, a name its module is
imported by on first use, so parsing a config (every command line, the serving tier's
frontend processes) reads the options classes only.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from learner.agents.r2d2.config import R2D2Options
from learner.agents.sac.config import SACOptions
from learner.agents.vtrace.config import VTraceOptions
from learner.common.spaces import UnsupportedSetup
from seedrl import codec
from seedrl.config import AgentOptions, LearnerConfig
from seedrl.proto import seedrl_pb2 as pb

if TYPE_CHECKING:
    import torch

    from learner.agents.base import Agent, AgentState
    from learner.agents.models import ActionHead, ModelSpec

    AgentFactory = Callable[[LearnerConfig, pb.SpaceSpec, torch.device, bool], Agent]
    TrainedNetwork = Callable[[ModelSpec, pb.SpaceSpec, bool], tuple[torch.nn.Module, ActionHead]]
    """A checkpoint's model spec, the env's action space and whether the observation
    carries an action mask -> the agent's inference network (fresh weights) and action
    head: what ``evaluate``, ``export`` and a served policy rebuild from a checkpoint, with
    no config."""


@dataclasses.dataclass(frozen=True)
class Lazy:
    """A callable named ``module:attribute``, imported when first called: what keeps the
    agents' torch classes out of a process that only parses a config. Picklable (the
    name travels), so an :class:`AgentRecipe` reaches a trainer process as before."""

    target: str

    def resolve(self) -> Callable[..., Any]:
        module, _, name = self.target.partition(":")
        return getattr(importlib.import_module(module), name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)


@dataclasses.dataclass(frozen=True)
class Registered:
    """One agent: what builds it, the section of knobs it reads and how its trained
    network comes back from a checkpoint (default: the shipped actor-critic)."""

    factory: AgentFactory
    options: type[AgentOptions]
    trained_network: TrainedNetwork = Lazy("learner.agents.vtrace.agent:actor_critic_network")


AGENTS: dict[str, Registered] = {
    "vtrace": Registered(Lazy("learner.agents.vtrace.agent:VTraceAgent"), VTraceOptions),
    "r2d2": Registered(
        Lazy("learner.agents.r2d2.agent:R2D2Agent"),
        R2D2Options,
        Lazy("learner.agents.r2d2.agent:q_network"),
    ),
    "sac": Registered(
        Lazy("learner.agents.sac.agent:SACAgent"),
        SACOptions,
        Lazy("learner.agents.sac.agent:trained_network"),
    ),
}
"""``--agent`` name -> the agent's factory (its config, the env's action space, the device)
and its options."""


def trained_network(
    agent: str | None, spec: ModelSpec, action_space: pb.SpaceSpec, masked: bool
) -> tuple[torch.nn.Module, ActionHead]:
    """The inference network and head of a checkpoint of ``agent`` (None, a checkpoint
    that names none: a dueling spec is R2D2's, any other V-trace's)."""
    if agent is None:
        agent = "r2d2" if spec.dueling else "vtrace"
    entry = AGENTS.get(agent)
    if entry is None:
        raise ValueError(f"the checkpoint is of --agent {agent}, which this seedrl lacks")
    return entry.trained_network(spec, action_space, masked)


def agent_sections() -> Mapping[str, type[AgentOptions]]:
    """``--agent`` name -> the agent's options class (what the config asks)."""
    return {name: entry.options for name, entry in AGENTS.items()}


def registered(config: LearnerConfig) -> Registered:
    """The registry entry of the agent ``--agent`` names."""
    try:
        return AGENTS[config.agent]
    except KeyError:
        raise ValueError(f"unknown agent {config.agent!r}; choose from {sorted(AGENTS)}") from None


def agent_factory(config: LearnerConfig) -> AgentFactory:
    """The factory of the agent ``--agent`` names."""
    return registered(config).factory


def make_agent(
    config: LearnerConfig, action_space: pb.SpaceSpec, device: torch.device, masked: bool = False
) -> Agent:
    """The agent ``--agent`` names, for an env's action space on ``device`` (``masked``: the
    observation carries an action mask, see ``--action-mask``)."""
    entry = registered(config)
    if action_space.kind == "box" and not entry.options.continuous_actions:
        able = " or ".join(sorted(n for n, e in AGENTS.items() if e.options.continuous_actions))
        raise UnsupportedSetup(
            f"--agent {config.agent} acts in discrete action spaces, not "
            f"{codec.spec_summary(action_space)}: use --agent {able}"
        )
    return entry.factory(config, action_space, device, masked)


@dataclasses.dataclass(frozen=True)
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
