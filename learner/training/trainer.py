"""The trainer: batches of unrolls -> the agent's update -> its optimizer steps.

One host-agnostic training object around any agent. The optimizer recipe (zero the
gradients, backward, combine them with other ranks', clip, skip what is not finite,
schedule the rate, step under the update guard, count the step) is written once, in
:class:`_Update`, the :class:`~learner.agents.base.Optimize` an agent's update applies
each of its losses through; where it runs — a thread next to inference, a child process, a
CUDA stream, a torchrun rank — is a host's business (:mod:`learner.training.hosts`), and
what differs between ranks and a lone learner is a :class:`GradientExchange` passed in.

Shape suffixes: T unroll length, B unrolls in the batch, O observation dims.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from learner.agents.base import INFERENCE_NETWORK, SAMPLE_PRIORITY, Agent, AgentState
from learner.agents.optim import apply_optimizer_settings, scaled_rate
from learner.agents.registry import AgentRecipe
from learner.common.schedules import StepClock, learning_rate_schedule
from learner.state import checkpoint
from learner.state.counters import StepCounter
from learner.state.stats import LearnerStats
from learner.state.trajectories import Unrolls, stacked_plane_mask
from seedrl.config import LearnerConfig

log = logging.getLogger(__name__)


def to_time_major(unrolls: Unrolls, device: torch.device) -> dict[str, torch.Tensor]:
    """Batch-major numpy unrolls -> time-major tensors ``[T+1, B, ...]`` on ``device``.

    Unrolls stored as single frames get their stacks rebuilt on ``device``, so only the
    frames travel there.
    """

    def tm(array) -> torch.Tensor:
        return torch.from_numpy(array).to(device, non_blocking=True).transpose(0, 1)

    frames = torch.from_numpy(unrolls.obs).to(device, non_blocking=True)
    batch = {
        "obs": stack_frames(frames, unrolls.first, unrolls.frame_stack).transpose(0, 1),
        **{name: tm(array) for name, array in row_fields(unrolls).items()},
    }
    if unrolls.sample_weight is not None:  # [B]: per unroll, not per row
        batch["sample_weight"] = torch.from_numpy(unrolls.sample_weight).to(device)
    return batch


def row_fields(unrolls: Unrolls) -> dict[str, np.ndarray]:
    """The unrolls' per-row arrays but the observations ``[N, T+1, ...]``, by the batch key
    the loss reads them under (every trainer builds its batch from this one list)."""
    fields = {
        "first": unrolls.first,
        "reward": unrolls.reward,
        "terminated": unrolls.terminated,
        "truncated": unrolls.truncated,
        "action": unrolls.action,
        "behaviour_params": unrolls.policy_params,
    }
    if unrolls.running_return is not None:
        fields["running_return"] = unrolls.running_return
    return fields


def stack_frames(frames: torch.Tensor, first: np.ndarray, depth: int) -> torch.Tensor:
    """Batch-major observations ``[B, T+1, *O]`` from stored frames ``[B, T+D, *F]`` (already
    on their device), as :func:`~learner.state.trajectories.stack_unroll_frames` rebuilds them;
    ``first`` is the unrolls' ``[B, T+1]`` episode starts. Depth 1: the frames as they are.

    Every trainer rebuilds stacks with this one function, so what it trains on cannot
    depend on which trainer the device picked.
    """
    if depth == 1:
        return frames
    keep_BRD = torch.from_numpy(stacked_plane_mask(first, depth)).to(frames.device)
    windows = frames.unfold(1, depth, 1).movedim(-1, 2)  # [B, T+1, D, *F]
    keep = keep_BRD.view(*keep_BRD.shape, *(1,) * (frames.dim() - 2))
    return torch.where(keep, windows, torch.zeros((), dtype=frames.dtype, device=frames.device))


class GradientBuffer:
    """Every trainable parameter's ``.grad`` as a view into one flat tensor.

    Why: zeroing the gradients, their global norm and its clipping become one op each
    over the flat tensor instead of a dozen small ones per step, whose per-op overhead
    dominates for small models. Autograd accumulates into an
    existing ``.grad`` in place, so the views hold through ``backward``; nothing may set
    them to None (use ``zero``).
    """

    def __init__(self, parameters: Iterable[torch.nn.Parameter], device: torch.device) -> None:
        trainable = [p for p in parameters if p.requires_grad]
        dtype = trainable[0].dtype if trainable else torch.float32
        self.flat = torch.zeros(sum(p.numel() for p in trainable), dtype=dtype, device=device)
        offset = 0
        for p in trainable:
            p.grad = self.flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()

    def zero(self) -> None:
        self.flat.zero_()

    def clip_norm(self, max_norm: float | None) -> torch.Tensor:
        """Scale the gradients to a global L2 norm of at most ``max_norm`` (None: leave
        them), as ``torch.nn.utils.clip_grad_norm_`` does; returns the norm before clipping."""
        total = torch.linalg.vector_norm(self.flat)
        if max_norm is not None:
            self.flat.mul_((max_norm / (total + 1e-6)).clamp(max=1.0))
        return total


class UpdateBound:
    """Shrinks an optimizer step that moved the policy too far back along its own
    direction until it is within the bound: the KL of a small step grows as its square, so
    scaling the step by ``sqrt(target / kl)`` brings it to about the target; a large step
    may need a second look."""

    RESCALES = 4
    """The most times one step is measured again after being scaled back."""
    TARGET = 0.9
    """Share of the bound a scaled-back step aims at, so that one rescale mostly suffices."""

    def __init__(self, model: torch.nn.Module | Iterable[torch.Tensor], max_kl: float) -> None:
        """``model``: the module (or the parameters) whose steps are bounded."""
        self.max_kl = max_kl
        params = model.parameters() if isinstance(model, torch.nn.Module) else model
        self.params: list[torch.Tensor] = [p for p in params if p.requires_grad]
        # The weights before the step, in buffers made once: no allocation per step.
        self.start = [torch.empty_like(p) for p in self.params]

    @torch.no_grad()
    def remember(self) -> None:
        """Keep the weights the next step starts from."""
        torch._foreach_copy_(self.start, self.params)

    @torch.no_grad()
    def enforce(self, measure: Callable[[], float]) -> dict[str, float]:
        """Scale the step just taken back while ``measure()`` (its KL) is past the bound;
        the step's KL as the optimizer took it and the share of it kept."""
        kl = taken = measure()
        kept = 1.0
        for _ in range(self.RESCALES):
            if kl <= self.max_kl:
                break
            # A step whose measure is not even finite is taken back whole.
            factor = math.sqrt(self.TARGET * self.max_kl / kl) if math.isfinite(kl) else 0.0
            torch._foreach_lerp_(self.params, self.start, 1.0 - factor)
            kept *= factor
            kl = measure()
        return {"update_kl": taken, "update_kept": kept}


class GradientExchange(Protocol):
    """How a step's gradient becomes the one applied: alone, as it is; among torchrun
    ranks, averaged over the ranks that had a batch."""

    world_size: int
    """Learners whose batches one step trains on (the schedules' clock counts them all)."""

    def combine(self, flat: torch.Tensor, contributed: bool) -> int:
        """Leave in ``flat`` the gradient to apply (this learner's is there when
        ``contributed``); returns how many learners contributed (0: no step)."""
        ...

    def scalars(self) -> dict[str, float]:
        """Extra per-step metrics."""
        ...

    def mean(self, value: float, weight: float) -> float:
        """The ``weight``-ed mean of a per-learner ``value`` over the learners, the same on
        each (every learner calls it at the same step)."""
        ...


class LocalGradients:
    """A learner alone: its own gradient, a step only when it has one."""

    world_size = 1

    def combine(self, flat: torch.Tensor, contributed: bool) -> int:
        return int(contributed)

    def scalars(self) -> dict[str, float]:
        return {}

    def mean(self, value: float, weight: float) -> float:
        return value


@dataclass(frozen=True)
class TrainerParts:
    """What a trainer is built from: the agent whose updates it applies and the state it
    trains, and what it shares with inference (the lock around a weight update, the step
    counter, the stats it counts skipped steps in). Every host takes these."""

    config: LearnerConfig
    agent: Agent
    state: AgentState
    device: torch.device
    stats: LearnerStats
    weights_lock: threading.Lock
    step_counter: StepCounter
    recipe: AgentRecipe | None = None
    """How a trainer in another process rebuilds the agent (None: only in this one)."""

    @property
    def model(self) -> torch.nn.Module:
        """The network inference runs."""
        return self.state.model

    @classmethod
    def unshared(
        cls,
        config: LearnerConfig,
        agent: Agent,
        state: AgentState,
        device: torch.device,
        step_counter: StepCounter | None = None,
    ) -> TrainerParts:
        """Parts for a trainer that shares nothing with inference (its stats and lock are
        its own, unused by others)."""
        return cls(
            config=config,
            agent=agent,
            state=state,
            device=device,
            stats=LearnerStats(),
            weights_lock=threading.Lock(),
            step_counter=StepCounter() if step_counter is None else step_counter,
        )


def _parameters(optimizer: torch.optim.Optimizer) -> list[torch.nn.Parameter]:
    return [p for group in optimizer.param_groups for p in group["params"]]


class Trainer:
    """An agent's updates applied to its state, one optimizer step at a time."""

    def __init__(
        self,
        parts: TrainerParts,
        exchange: GradientExchange | None = None,
        update_guard: Callable[[], AbstractContextManager[object]] | None = None,
    ) -> None:
        """``update_guard`` brackets each optimizer step (default: the weights lock), so
        whoever reads the weights sees whole updates."""
        config = parts.config
        self.config = config
        self.agent = parts.agent
        self.state = parts.state
        self.device = parts.device
        self.stats = parts.stats
        self.weights_lock = parts.weights_lock
        self.step_counter = parts.step_counter
        self.exchange: GradientExchange = exchange or LocalGradients()
        self.update_guard = update_guard or (lambda: self.weights_lock)
        self.between_updates = threading.Lock()
        """Held over each whole update (forward, backward, step), so that whoever writes
        the weights from outside (a population's exploit) does so between two updates,
        never under a backward pass that still needs the weights it started from."""
        self.gradients = {
            name: GradientBuffer(_parameters(optimizer), self.device)
            for name, optimizer in self.state.optimizers.items()
        }
        """Each optimizer's gradients as one flat buffer (what ranks exchange)."""
        self.learning_rate = learning_rate_schedule(config)
        self.bounds = {
            name: UpdateBound(_parameters(self.state.optimizers[name]), max_kl)
            for name, max_kl in self.state.update_bounds.items()
        }
        """Keeps each step of these optimizers within its bound of the policy it started from."""
        self.feedback: list[tuple[np.ndarray, np.ndarray]] = []
        """(sample ids, new priorities) of the steps since :meth:`take_feedback`, for the
        host to hand to the store."""
        self.frames_per_step = (
            self.agent.new_frames_per_batch() / self.agent.updates_per_batch
        ) * self.exchange.world_size
        """New transitions per optimizer step (the schedules' clock): a batch reused for K
        steps advances the clock by its frames once, not K times, and a replayed one by
        its new frames only."""

    @property
    def model(self) -> torch.nn.Module:
        """The network inference runs."""
        return self.state.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The inference network's optimizer."""
        return self.state.optimizer

    @property
    def grads(self) -> GradientBuffer:
        """The inference network's optimizer's gradients."""
        return self.gradients[INFERENCE_NETWORK]

    def clock(self, step: int) -> StepClock:
        return StepClock(step, step * self.frames_per_step)

    def loss(
        self, batch: dict[str, torch.Tensor], core_state: tuple[torch.Tensor, ...], step: int = 0
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The agent's total loss and its parts for one time-major batch at step ``step``,
        with no step taken: for an agent with one loss that says how (``loss``)."""
        return self.agent.loss(self.state, batch, core_state, self.clock(step))  # type: ignore[attr-defined]

    def train_step(self, unrolls: Unrolls) -> dict[str, float] | None:
        """One optimizer step on ``unrolls``; None when skipped for a non-finite loss/gradient."""
        return self.train_batch(unrolls, updates=1)[0]

    def train_batch(
        self, unrolls: Unrolls, updates: int | None = None
    ) -> list[dict[str, float] | None]:
        """``updates`` updates on ``unrolls`` (default ``--updates-per-batch``), the batch
        sent to the device once; one entry per update as ``train_step`` returns."""
        batch = to_time_major(unrolls, self.device)
        core_state = tuple(torch.from_numpy(s).to(self.device) for s in unrolls.core_state)
        return self.steps_on(batch, core_state, unrolls, updates)

    def steps_on(
        self,
        batch: dict[str, torch.Tensor],
        core_state: tuple[torch.Tensor, ...],
        unrolls: Unrolls,
        updates: int | None = None,
    ) -> list[dict[str, float] | None]:
        """``updates`` updates on one device batch, each with the losses recomputed from
        the weights the previous one left (so V-trace sees how far the policy has moved)."""
        count = self.agent.updates_per_batch if updates is None else updates
        return [
            self.step_on(batch, core_state, unrolls, self.step_counter.value) for _ in range(count)
        ]

    def step_on(
        self,
        batch: dict[str, torch.Tensor] | None,
        core_state: tuple[torch.Tensor, ...],
        unrolls: Unrolls | None,
        step: int,
    ) -> dict[str, float] | None:
        """One update, once for every host: the agent's update on ``batch`` (already on
        the device, see ``to_time_major``; None: this learner has none and only joins the
        exchanges) at step ``step``, each of its losses' gradients combined, clipped and
        applied. Returns the update's scalars, or None when it trained on nothing of its
        own (no batch, or a loss or gradient that was not finite)."""
        update = _Update(self, step)
        terms = None
        with self.between_updates:
            if batch is not None:
                terms = self.agent.update(self.state, batch, core_state, self.clock(step), update)
            update.finish()
        if terms is None or unrolls is None or update.own_skipped or not update.counted:
            return None
        priority = terms.pop(SAMPLE_PRIORITY, None)
        if priority is not None and unrolls.sample_id is not None:
            self.feedback.append((unrolls.sample_id.copy(), priority.float().cpu().numpy()))
        scalars = {k: float(v) for k, v in terms.items()}
        scalars.update(update.step_scalars)
        scalars["policy_lag"] = policy_lag(step, unrolls)
        scalars.update(update.bound_scalars)
        scalars.update(self.exchange.scalars())
        return scalars

    def take_feedback(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """The (sample ids, priorities) pairs gathered since the last call."""
        taken, self.feedback = self.feedback, []
        return taken

    def set_learning_rate(self, step: int, optimizer: str = INFERENCE_NETWORK) -> float:
        """Set the scheduled learning rate of optimizer step ``step`` (0-based) on
        ``optimizer``; returns it."""
        lr = self.learning_rate(self.clock(step).frames)
        if self.config.effective_lr_schedule != "constant":
            for group in self.state.optimizers[optimizer].param_groups:
                group["lr"] = scaled_rate(group, lr)
        return lr

    def retune(self, agent: Agent, config: LearnerConfig) -> None:
        """Train on with other hyperparameters (a population member's new values): the
        agent built from ``config`` computes the losses, and ``config``'s learning rate is
        set on every optimizer now and scheduled from here on. Call it holding
        :attr:`between_updates`, so no update runs half on the old values."""
        self.agent, self.config = agent, config
        self.learning_rate = learning_rate_schedule(config)
        for optimizer in self.state.optimizers.values():
            apply_optimizer_settings(optimizer, config)

    def _skip(self, what: str) -> None:
        """Count and log a skipped step (the weights stay as they were)."""
        self.stats.nonfinite_skipped += 1
        log.warning(
            "skipped a learner step: non-finite %s (%d so far)", what, self.stats.nonfinite_skipped
        )

    def training_state(self) -> checkpoint.TrainingState:
        """Everything the agent's state holds and the step count, as of the last whole step."""
        return agent_training_state(self.agent, self.state, self.weights_lock, self.step_counter)


def agent_training_state(
    agent: Agent,
    state: AgentState,
    weights_lock: AbstractContextManager[Any],
    step_counter: StepCounter,
) -> checkpoint.TrainingState:
    """A consistent CPU copy of what ``state`` holds (by the agent's checkpoint keys) and
    the step count, taken under ``weights_lock``."""
    return checkpoint.capture(
        lambda: agent.state_dict(state), weights_lock, lambda: step_counter.value
    )


class _Update:
    """One update's :class:`~learner.agents.base.Optimize`: the recipe each loss goes
    through, with every optimizer of the state joined in its order, so that torchrun
    ranks meet in the same collectives whatever each one's agent did (a rank without a
    batch, or with a loss that was not finite, joins with zeros)."""

    def __init__(self, trainer: Trainer, step: int) -> None:
        self.trainer = trainer
        self.step = step
        self.order = trainer.state.order_at(step)
        """The optimizer steps this update joins, in order (one may come several times)."""
        self.next = 0
        """Index into ``order`` of the first step this update has not come to."""
        self.counted = False
        """A step was applied (and counted) in this update."""
        self.own_skipped = False
        """This learner's loss or gradient was not finite: its terms are not reported."""
        self.step_scalars: dict[str, float] = {}
        self.bound_scalars: dict[str, float] = {}

    def minimize(
        self,
        loss: torch.Tensor,
        optimizer: str = INFERENCE_NETWORK,
        policy_change: Callable[[], torch.Tensor] | None = None,
    ) -> bool:
        self._come_to(optimizer)
        grads = self.trainer.gradients[optimizer]
        grads.zero()
        own = bool(torch.isfinite(loss))
        if own:
            loss.backward()
        else:
            self.trainer._skip("loss")
            self.own_skipped = True
        self.next += 1
        return self._apply(optimizer, own, policy_change if own else None)

    def finish(self) -> None:
        """Join the exchanges of the optimizers the update did not step."""
        self._come_to(None)

    def _come_to(self, optimizer: str | None) -> None:
        """Join, with nothing of this learner's, every step before the next one of
        ``optimizer`` (None: all that are left); an optimizer the order names no more of
        is refused."""
        if optimizer is None:
            stop = len(self.order)
        elif optimizer in self.order[self.next :]:
            stop = self.order.index(optimizer, self.next)
        else:
            raise ValueError(
                f"this update minimises its optimizers in the state's order {self.order}:"
                f" one more {optimizer!r} came too late or too often"
            )
        while self.next < stop:
            name = self.order[self.next]
            self.trainer.gradients[name].zero()
            self.next += 1
            self._apply(name, False, None)

    def _apply(
        self, name: str, contributed: bool, policy_change: Callable[[], torch.Tensor] | None
    ) -> bool:
        trainer = self.trainer
        grads = trainer.gradients[name]
        exchange = trainer.exchange
        if exchange.combine(grads.flat, contributed) == 0:
            return False
        limit = trainer.state.max_grad_norms.get(name, trainer.config.max_grad_norm)
        grad_norm = grads.clip_norm(limit)
        if not torch.isfinite(grad_norm):  # the same combined gradient on every rank
            grads.zero()
            trainer._skip("gradient")
            self.own_skipped = True
            return False
        lr = trainer.set_learning_rate(self.step, name)
        bound = trainer.bounds.get(name)
        after = trainer.state.after_step.get(name)

        def measure() -> float:
            if policy_change is None:  # nothing of this learner's moved: no weight
                return exchange.mean(0.0, 0.0)
            return exchange.mean(float(policy_change()), 1.0)

        with trainer.update_guard():
            if bound is not None:
                bound.remember()
            trainer.state.optimizers[name].step()
            if bound is not None:
                self._scalars(self.bound_scalars, name, bound.enforce(measure))
            if after is not None:
                after()
            if not self.counted:  # the step count names the update, not each optimizer's step
                trainer.step_counter.value += 1
                self.counted = True
        self._scalars(self.step_scalars, name, {"grad_norm": float(grad_norm), "learning_rate": lr})
        return True

    @staticmethod
    def _scalars(into: dict[str, float], name: str, scalars: dict[str, float]) -> None:
        """The inference network's optimizer's scalars as they are named, another's with
        its name after them."""
        suffix = "" if name == INFERENCE_NETWORK else f"_{name}"
        into.update({f"{key}{suffix}": value for key, value in scalars.items()})


def policy_lag(step: int, unrolls: Unrolls) -> float:
    """Mean over the batch's trained actions (rows ``0..T-1`` of every unroll) of the
    optimizer steps between the weights that chose the action and the weights
    (``step``) the gradient is computed with. 0: fully on-policy."""
    t = unrolls.acted_step.shape[1] - 1
    return float(step - unrolls.acted_step[:, :t].mean())
