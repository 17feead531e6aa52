"""The agent seam: what differs between learning algorithms, behind one small interface.

An agent says which network it trains, how batched inference turns that network's
outputs into actions, what the learner keeps of the frames to train on, and its loss.
Serving, batching, trajectory slots, checkpoints, metrics and the trainer hosts know an
agent only through :class:`Agent`, so a second algorithm is a second implementation,
not branches through the serve loop.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from learner.agents.models import ActionHead, ActorCritic
from learner.agents.policy import Policy
from learner.state.trajectories import UnrollQueue
from learner.training.schedules import StepClock
from seedrl.proto import seedrl_pb2 as pb

LossTerms = dict[str, torch.Tensor]
"""A loss's parts by metric name (``loss_policy``, ``entropy``, ...), detached."""


class Agent(Protocol):
    """One learning algorithm as the learner hosts it, built for one env's action space
    and one device."""

    name: str
    """The ``--agent`` value that selects it."""
    head: ActionHead
    """How actions are parameterised, sampled and scored."""

    def build_model(self, observation_space: pb.SpaceSpec, torso: str) -> ActorCritic:
        """The network to train, for observations as the model sees them, on the encoder
        ``torso`` the learner chose for them (mlp, cnn, resnet)."""
        ...

    def inference_policy(self, model: ActorCritic, seed: int | tuple[int, ...]) -> Policy:
        """What batched inference runs: observations in, actions (and what the loss needs
        of the acting policy) out."""
        ...

    def make_store(self) -> UnrollQueue:
        """Where finished unrolls wait for the trainer (bounded: back-pressure)."""
        ...

    def loss(
        self,
        model: ActorCritic,
        batch: dict[str, torch.Tensor],
        core_state: tuple[torch.Tensor, ...],
        clock: StepClock,
    ) -> tuple[torch.Tensor, LossTerms]:
        """The total loss to minimise on one time-major batch at the optimizer step
        ``clock`` names (the schedules read it), and its parts for the metrics."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Statistics the loss keeps between steps, by checkpoint key (empty: none)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take back what :meth:`state_dict` saved (keys it does not know are ignored)."""
        ...
