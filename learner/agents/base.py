"""The agent seam: what differs between learning algorithms, behind one small interface.

An agent builds everything it trains (:class:`AgentState`: its networks, its optimizers
and whatever else it keeps between steps), says how batched inference turns the
inference network's outputs into actions, what the learner keeps of the frames to train
on, and how one batch updates its state. Serving, batching, trajectory slots,
checkpoints, metrics and the trainer hosts know an agent only through :class:`Agent`, so
a second algorithm is a second implementation, not branches through the serve loop; the
optimizer recipe around the agent's losses (:class:`Optimize`) is the trainer's, written
once for every agent and host.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from learner.agents.models import ActionHead
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
"""Loss-term key of the ``[T, B]`` log-probabilities V-trace's loss gave the batch's
actions, there only when steps are bounded (``--max-update-kl``): the agent measures how
far its step moved the policy from them (:meth:`Optimize.minimize`'s ``policy_change``)."""

INFERENCE_NETWORK = "model"
"""The name, among an :class:`AgentState`'s networks, of the one inference runs; its
optimizer goes by the same name. Their checkpoint keys are ``model`` and ``optimizer``."""


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


@dataclass
class AgentState:
    """Everything one agent trains and keeps between steps, built by :meth:`Agent.build`:
    one learner may hold several (population-based training), all of one agent.

    Optimizers own disjoint parameters (each gets its own flat gradient buffer in the
    trainer) and an update minimises them in the order given here, or in the one
    :attr:`update_order` gives for its step.
    """

    networks: dict[str, torch.nn.Module]
    """By name; :data:`INFERENCE_NETWORK` is the one inference runs."""
    optimizers: dict[str, torch.optim.Optimizer]
    """By name (usually the network's whose parameters it steps), in update order."""
    extras: dict[str, Any] = field(default_factory=dict)
    """What else the algorithm keeps (a target network, a return normalizer), by name."""
    after_step: dict[str, Callable[[], None]] = field(default_factory=dict)
    """Optimizer name -> what runs right after each of its steps, inside the update guard
    (inference never sees the weights between), e.g. a projection of the weights."""
    update_bounds: dict[str, float] = field(default_factory=dict)
    """Optimizer name -> the most a step of it may move the policy (KL), the trainer's
    ``--max-update-kl`` service; the agent passes the measure to :meth:`Optimize.minimize`."""
    max_grad_norms: dict[str, float | None] = field(default_factory=dict)
    """Optimizer name -> its gradient-norm clip in place of ``--max-grad-norm`` (None: not
    clipped, for an algorithm whose recipe clips nothing); a non-finite gradient is
    skipped either way."""
    update_order: Callable[[int], Sequence[str]] | None = None
    """Optimizer step -> the optimizers that update minimises, in order, each as often as
    it is named (SAC's delayed actor: the critics every update, the actor and the
    temperature k times every k-th); None: each of :attr:`optimizers` once. It may depend
    on the step, never on the batch: torchrun ranks join every named step in the same
    order, a rank with nothing to apply with zeros."""

    @property
    def model(self) -> Any:
        """The network inference runs."""
        return self.networks[INFERENCE_NETWORK]

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The inference network's optimizer."""
        return self.optimizers[INFERENCE_NETWORK]

    def order_at(self, step: int) -> list[str]:
        """The optimizers the update at optimizer step ``step`` minimises, in order."""
        if self.update_order is None:
            return list(self.optimizers)
        return list(self.update_order(step))

    def networks_state_dict(self) -> dict[str, Any]:
        """The inference network and its optimizer by their checkpoint keys."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}


class Optimize(Protocol):
    """The trainer's side of an update: what applying one loss takes, in one place for
    every agent (zeroing, backward, the gradient exchange among torchrun ranks, clipping
    by --max-grad-norm, skipping a non-finite loss or gradient, the learning-rate
    schedule, the update guard, the step count)."""

    def minimize(
        self,
        loss: torch.Tensor,
        optimizer: str = INFERENCE_NETWORK,
        policy_change: Callable[[], torch.Tensor] | None = None,
    ) -> bool:
        """One step of ``optimizer`` down the gradient of ``loss`` (a scalar); False when
        no step was applied (skipped, or no learner had a batch). ``policy_change``
        measures, after the step, how far it moved the policy (a scalar KL estimate):
        needed by an optimizer with an update bound (:attr:`AgentState.update_bounds`)."""
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
    updates_per_batch: int
    """Updates the trainer takes on each batch (``--updates-per-batch``, or the agent's
    own when it is unset)."""

    def build(self, observation_space: pb.SpaceSpec, torso: str) -> AgentState:
        """Everything it trains, fresh, for observations as the model sees them, on the
        encoder ``torso`` the learner chose for them (mlp, cnn, resnet), on its device."""
        ...

    def inference_policy(self, model: Any, seed: int | tuple[int, ...]) -> Policy:
        """What batched inference runs on the inference network ``model``: observations
        in, actions (and what the loss needs of the acting policy) out."""
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

    def update(
        self,
        state: AgentState,
        batch: dict[str, torch.Tensor],
        core_state: tuple[torch.Tensor, ...],
        clock: StepClock,
        optimize: Optimize,
    ) -> LossTerms:
        """One update of ``state`` on one time-major batch at the optimizer step ``clock``
        names (the schedules read it): its losses, each applied through ``optimize``;
        returns the loss's parts for the metrics (and :data:`SAMPLE_PRIORITY`)."""
        ...

    def state_dict(self, state: AgentState) -> dict[str, Any]:
        """Everything ``state`` holds, by checkpoint key: ``model`` and ``optimizer`` for
        the inference network and its optimizer, the agent's own keys for the rest."""
        ...

    def load_state_dict(self, state: AgentState, saved: dict[str, Any]) -> None:
        """Take back into ``state`` what :meth:`state_dict` saved (a checkpoint: keys it
        does not know are ignored)."""
        ...
