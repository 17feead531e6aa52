"""The trainer: batches of unrolls -> the agent's loss -> one optimizer step.

One host-agnostic training object. The optimizer recipe (zero the gradients, backward,
combine them with other ranks', clip, schedule the rate, step) is written once, in
:meth:`Trainer.step_on`; where it runs — a thread next to inference, a child process, a
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
from typing import Protocol

import numpy as np
import torch

from learner.agents.base import SAMPLE_PRIORITY, UPDATE_LOGP, Agent, BoundedAgent
from learner.agents.models import ActorCritic
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

    def clip_norm(self, max_norm: float) -> torch.Tensor:
        """Scale the gradients to a global L2 norm of at most ``max_norm``, as
        ``torch.nn.utils.clip_grad_norm_`` does; returns the norm before clipping."""
        total = torch.linalg.vector_norm(self.flat)
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

    def __init__(self, model: torch.nn.Module, max_kl: float) -> None:
        self.max_kl = max_kl
        self.params: list[torch.Tensor] = [p for p in model.parameters() if p.requires_grad]
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
    """What a trainer is built from: the agent whose loss it minimises, the model and
    optimizer it steps, and what it shares with inference (the lock around a weight update,
    the step counter, the stats it counts skipped steps in)."""

    config: LearnerConfig
    agent: Agent
    model: ActorCritic
    optimizer: torch.optim.Optimizer
    device: torch.device
    stats: LearnerStats
    weights_lock: threading.Lock
    step_counter: StepCounter

    @classmethod
    def unshared(
        cls,
        config: LearnerConfig,
        agent: Agent,
        model: ActorCritic,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        step_counter: StepCounter | None = None,
    ) -> TrainerParts:
        """Parts for a trainer that shares nothing with inference (its stats and lock are
        its own, unused by others)."""
        return cls(
            config=config,
            agent=agent,
            model=model,
            optimizer=optimizer,
            device=device,
            stats=LearnerStats(),
            weights_lock=threading.Lock(),
            step_counter=StepCounter() if step_counter is None else step_counter,
        )


class Trainer:
    """An agent's loss minimised on the model, one optimizer step at a time."""

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
        self.model = parts.model
        self.optimizer = parts.optimizer
        self.device = parts.device
        self.stats = parts.stats
        self.weights_lock = parts.weights_lock
        self.step_counter = parts.step_counter
        self.exchange: GradientExchange = exchange or LocalGradients()
        self.update_guard = update_guard or (lambda: self.weights_lock)
        self.grads = GradientBuffer(self.model.parameters(), self.device)
        self.learning_rate = learning_rate_schedule(config)
        self.bound = (
            None if (bound := config.effective_max_update_kl) is None
            else UpdateBound(self.model, bound)
        )  # fmt: skip
        """Keeps each step within ``--max-update-kl`` of the policy it started from."""
        self.feedback: list[tuple[np.ndarray, np.ndarray]] = []
        """(sample ids, new priorities) of the steps since :meth:`take_feedback`, for the
        host to hand to the store."""
        self.frames_per_step = (
            self.agent.new_frames_per_batch() / config.updates_per_batch
        ) * self.exchange.world_size
        """New transitions per optimizer step (the schedules' clock): a batch reused for K
        steps advances the clock by its frames once, not K times, and a replayed one by
        its new frames only."""

    def clock(self, step: int) -> StepClock:
        return StepClock(step, step * self.frames_per_step)

    def loss(
        self, batch: dict[str, torch.Tensor], core_state: tuple[torch.Tensor, ...], step: int = 0
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The agent's total loss and its parts for one time-major batch at step ``step``."""
        return self.agent.loss(self.model, batch, core_state, self.clock(step))

    def train_step(self, unrolls: Unrolls) -> dict[str, float] | None:
        """One optimizer step on ``unrolls``; None when skipped for a non-finite loss/gradient."""
        return self.train_batch(unrolls, updates=1)[0]

    def train_batch(
        self, unrolls: Unrolls, updates: int | None = None
    ) -> list[dict[str, float] | None]:
        """``updates`` optimizer steps on ``unrolls`` (default ``--updates-per-batch``),
        the batch sent to the device once; one entry per step as ``train_step`` returns."""
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
        """``updates`` steps on one device batch, each with the loss recomputed from the
        weights the previous step left (so V-trace sees how far the policy has moved)."""
        count = self.config.updates_per_batch if updates is None else updates
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
        """The optimizer recipe, once for every host: the loss of ``batch`` (already on the
        device, see ``to_time_major``; None: this learner has none and only joins the
        exchange) at step ``step``, its gradient combined, clipped and applied. Returns
        the step's scalars, or None when it trained on nothing of its own."""
        self.grads.zero()
        terms = None
        if batch is not None:
            total, terms = self.loss(batch, core_state, step)
            if torch.isfinite(total):
                total.backward()
            else:
                self._skip("loss")
                terms = None
        if self.exchange.combine(self.grads.flat, terms is not None) == 0:
            return None
        grad_norm = self.grads.clip_norm(self.config.max_grad_norm)
        if not torch.isfinite(grad_norm):  # the same combined gradient on every rank
            self.grads.zero()
            self._skip("gradient")
            return None
        lr = self.set_learning_rate(step)
        before_logp = None if terms is None else terms.pop(UPDATE_LOGP, None)
        bound_scalars: dict[str, float] = {}
        with self.update_guard():
            if self.bound is not None:
                self.bound.remember()
            self.optimizer.step()
            if self.bound is not None:
                bound_scalars = self.bound.enforce(
                    lambda: self.exchange.mean(*self._update_kl(batch, core_state, before_logp))
                )
            self.model.bound_log_std_()
            self.step_counter.value += 1
        if terms is None or unrolls is None:
            return None
        priority = terms.pop(SAMPLE_PRIORITY, None)
        if priority is not None and unrolls.sample_id is not None:
            self.feedback.append((unrolls.sample_id.copy(), priority.float().cpu().numpy()))
        scalars = {k: float(v) for k, v in terms.items()}
        scalars["grad_norm"] = float(grad_norm)
        scalars["learning_rate"] = lr
        scalars["policy_lag"] = policy_lag(step, unrolls)
        scalars.update(bound_scalars)
        scalars.update(self.exchange.scalars())
        return scalars

    def _update_kl(
        self,
        batch: dict[str, torch.Tensor] | None,
        core_state: tuple[torch.Tensor, ...],
        before_logp: torch.Tensor | None,
    ) -> tuple[float, float]:
        """(how far the step just taken moved the policy on this learner's batch, the
        weight of that batch among the ranks': 0 for a rank that had none)."""
        if batch is None or before_logp is None:
            return 0.0, 0.0
        assert isinstance(self.agent, BoundedAgent)  # the config allows the bound on no other
        return float(self.agent.policy_change(self.model, batch, core_state, before_logp)), 1.0

    def take_feedback(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """The (sample ids, priorities) pairs gathered since the last call."""
        taken, self.feedback = self.feedback, []
        return taken

    def set_learning_rate(self, step: int) -> float:
        """Set the scheduled learning rate of optimizer step ``step`` (0-based); returns it."""
        lr = self.learning_rate(self.clock(step).frames)
        if self.config.effective_lr_schedule != "constant":
            for group in self.optimizer.param_groups:
                group["lr"] = lr
        return lr

    def _skip(self, what: str) -> None:
        """Count and log a skipped step (the weights stay as they were)."""
        self.stats.nonfinite_skipped += 1
        log.warning(
            "skipped a learner step: non-finite %s (%d so far)", what, self.stats.nonfinite_skipped
        )

    def training_state(self) -> checkpoint.TrainingState:
        """Weights, optimizer state, the agent's statistics and the step count, as of the
        last whole step."""
        return checkpoint.capture(
            self.model, self.optimizer, self.weights_lock, lambda: self.step_counter.value,
            self.agent.state_dict(),
        )  # fmt: skip


def policy_lag(step: int, unrolls: Unrolls) -> float:
    """Mean over the batch's trained actions (rows ``0..T-1`` of every unroll) of the
    optimizer steps between the weights that chose the action and the weights
    (``step``) the gradient is computed with. 0: fully on-policy."""
    t = unrolls.acted_step.shape[1] - 1
    return float(step - unrolls.acted_step[:, :t].mean())


def apply_optimizer_settings(optimizer: torch.optim.Optimizer, config: LearnerConfig) -> None:
    """Set the configured learning rate and epsilon on every parameter group.

    ``load_state_dict`` brings back the hyper-parameters a checkpoint was saved with, so
    without this a resumed run would ignore ``--learning-rate`` (and a run saved before
    the defaults changed would keep the old rate with the new batch).
    """
    for group in optimizer.param_groups:
        group["lr"] = config.learning_rate
        group["eps"] = config.adam_eps


def make_optimizer(model: ActorCritic, config: LearnerConfig) -> torch.optim.Optimizer:
    """Adam over the model's parameters, as ``config`` sets it."""
    # The fused kernel updates every parameter in one op, where the default pays per-op
    # overhead per parameter, which dominates for the small models here.
    fused = next(model.parameters()).device.type in ("cpu", "cuda")
    return torch.optim.Adam(
        model.parameters(), lr=config.learning_rate, eps=config.adam_eps, fused=fused
    )
