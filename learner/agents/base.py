"""The agent seam: what differs between learning algorithms, behind one small interface.

An agent says which network it trains, how batched inference turns that network's
outputs into actions, what the learner keeps of the frames to train on, and its loss.
Serving, batching, trajectory slots, checkpoints, metrics and the trainer hosts know an
agent only through :class:`Agent`, so a second algorithm is a second implementation,
not branches through the serve loop.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import torch

from learner.agents.models import ActionHead, ActorCritic
from learner.agents.policy import Policy
from learner.common.schedules import StepClock
from learner.state.trajectories import Unrolls
from seedrl.proto import seedrl_pb2 as pb

if TYPE_CHECKING:
    from learner.state.files import Lease

LossTerms = dict[str, torch.Tensor]
"""A loss's parts by metric name (``loss_policy``, ``entropy``, ...), detached; scalars,
except :data:`SAMPLE_PRIORITY`."""

SAMPLE_PRIORITY = "sample_priority"
"""Loss-term key of a ``[B]`` tensor: each sampled unroll's new priority, which the
trainer host hands back to the store (:meth:`Store.feedback`) instead of the metrics."""


UPDATE_LOGP = "update_logp"
"""Loss-term key of the ``[T, B]`` log-probabilities the loss gave the batch's actions,
there only when steps are bounded (``--max-update-kl``, V-trace's default): after the
optimizer step the trainer hands them back to :meth:`BoundedAgent.policy_change` to
measure how far the step moved the policy."""


class SavedStoreError(RuntimeError):
    """A store's saved file is unreadable or does not fit this run (:meth:`Store.load`)."""


class Store(Protocol):
    """What the learner keeps of finished unrolls between inference and the trainer: a
    bounded queue (each unroll trained on once) or a replay (sampled by priority)."""

    def __len__(self) -> int: ...
    def has_room(self) -> bool:
        """A ``put`` now would not wait."""
        ...

    def put(self, unrolls: Unrolls, timeout: float | None = None) -> bool:
        """Keep finished unrolls (may wait while full: back-pressure); False if it timed
        out or the store is closed."""
        ...

    def get(self, n: int, timeout: float | None = None) -> Unrolls | None:
        """``n`` unrolls to train on, or None on timeout or close."""
        ...

    def close(self) -> None: ...
    def feedback(self, sample_id: np.ndarray, priority: np.ndarray) -> None:
        """New priorities of unrolls ``get`` handed out (by ``Unrolls.sample_id``)."""
        ...

    def metrics(self) -> dict[str, float]:
        """Extra keys for each metrics record."""
        ...

    def save(self, path: Path, lease: Lease | None = None) -> int:
        """Write what a resumed run should find in the store to ``path`` (renamed into
        place only while ``lease`` holds); the bytes written (0, and no file, when it
        keeps nothing across runs)."""
        ...

    def load(self, path: Path, template: Unrolls) -> int:
        """Take back what :meth:`save` wrote (``template``: one unroll of this run's
        shapes, which the saved ones must have); the unrolls restored."""
        ...


class Agent(Protocol):
    """One learning algorithm as the learner hosts it, built for one env's action space
    and one device."""

    name: str
    """The ``--agent`` value that selects it."""
    head: ActionHead
    """How actions are parameterised, sampled and scored."""
    return_discount: float | None
    """The discount of the running episode return the trajectories keep for the loss
    (:attr:`Unrolls.running_return`); None: the loss reads none."""

    def build_model(self, observation_space: pb.SpaceSpec, torso: str) -> ActorCritic:
        """The network to train, for observations as the model sees them, on the encoder
        ``torso`` the learner chose for them (mlp, cnn, resnet)."""
        ...

    def inference_policy(self, model: ActorCritic, seed: int | tuple[int, ...]) -> Policy:
        """What batched inference runs: observations in, actions (and what the loss needs
        of the acting policy) out."""
        ...

    def sequence_layout(self) -> tuple[int, int]:
        """(T, k): transitions per stored unroll, and rows beyond the bootstrap frame a
        slot's consecutive unrolls share (the trajectory builder's shape)."""
        ...

    def make_store(self) -> Store:
        """Where finished unrolls wait for the trainer (bounded)."""
        ...

    def new_frames_per_batch(self) -> float:
        """Frames of new experience one training batch stands for: the clock that frame
        budgets and schedules run on, whatever share of the batch is replayed."""
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


@runtime_checkable
class BoundedAgent(Protocol):
    """An agent whose policy the trainer can keep from moving too far in one step
    (``--max-update-kl``): its loss leaves :data:`UPDATE_LOGP` among the terms."""

    def policy_change(
        self,
        model: ActorCritic,
        batch: dict[str, torch.Tensor],
        core_state: tuple[torch.Tensor, ...],
        before_logp: torch.Tensor,
    ) -> torch.Tensor:
        """How far the model's policy now is from the one that gave the batch's actions
        ``before_logp`` in the loss: an estimate of the mean KL divergence (a scalar)."""
        ...
