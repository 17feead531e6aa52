"""The trainer: batches of unrolls -> V-trace actor-critic loss -> optimizer step.

It runs in its own thread next to the event loop that serves inference, on the very
model inference uses: ``weights_lock`` is held only for the optimizer step and for each
inference forward pass, so both see whole updates and neither waits long.

Transitions ``t -> t+1`` of an unroll (``t < T``) are trained on; a transition that
starts on a frame where the episode ended (final observation -> reset observation) is
not a real transition: it is masked out by giving it ``log_rho = -inf`` (V-trace then
leaves it untouched and cuts the trace there) and zero weight in every loss term.
Discount is 0 only into a *terminated* frame; a *truncated* frame keeps ``gamma`` so the
episode bootstraps from the value of its final observation.

Shape suffixes: T unroll length, B unrolls in the batch, O observation dims, P policy
parameters.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from learner.agents.models import ActionHead, ActorCritic, autocast, resolve_precision
from learner.agents.vtrace import targets as vtrace
from learner.serving.inference import StepCounter
from learner.state import checkpoint
from learner.state.normalize import ReturnNormalizer
from learner.state.stats import LearnerStats
from learner.state.trajectories import UnrollQueue, Unrolls, stacked_plane_mask
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
    return {
        "obs": stack_frames(frames, unrolls.first, unrolls.frame_stack).transpose(0, 1),
        "first": tm(unrolls.first),
        "reward": tm(unrolls.reward),
        "terminated": tm(unrolls.terminated),
        "truncated": tm(unrolls.truncated),
        "action": tm(unrolls.action),
        "behaviour_params": tm(unrolls.policy_params),
    }


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


@dataclass(frozen=True)
class TrainerParts:
    """What a trainer is built from: the model and optimizer it steps, where its batches
    come from, and what it shares with inference (the lock around a weight update and the
    step counter). One value, so the thread, device, ranked and child-process trainers
    are all built the same way and none depends on an argument order."""

    config: LearnerConfig
    model: ActorCritic
    head: ActionHead
    optimizer: torch.optim.Optimizer
    device: torch.device
    queue: UnrollQueue
    stats: LearnerStats
    weights_lock: threading.Lock
    step_counter: StepCounter
    return_normalizer: ReturnNormalizer | None = None
    """The statistics to go on with (a resumed learner's); the trainer starts fresh ones
    when None and ``--normalize-returns`` is on."""

    @classmethod
    def unshared(
        cls,
        config: LearnerConfig,
        model: ActorCritic,
        head: ActionHead,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        step_counter: StepCounter | None = None,
        return_normalizer: ReturnNormalizer | None = None,
    ) -> TrainerParts:
        """Parts for a trainer that is handed its batches (``train_batch``) and shares
        nothing with inference: the queue, stats and lock are its own, unused by others."""
        return cls(
            config=config,
            model=model,
            head=head,
            optimizer=optimizer,
            device=device,
            queue=UnrollQueue(1),
            stats=LearnerStats(),
            weights_lock=threading.Lock(),
            step_counter=StepCounter() if step_counter is None else step_counter,
            return_normalizer=return_normalizer,
        )


class Trainer:
    """V-trace actor-critic learner over the shared model."""

    def __init__(self, parts: TrainerParts) -> None:
        config, model, device = parts.config, parts.model, parts.device
        self.config = config
        self.model = model
        self.head = parts.head
        self.optimizer = parts.optimizer
        self.device = device
        self.queue = parts.queue
        self.stats = parts.stats
        self.weights_lock = parts.weights_lock
        self.step_counter = parts.step_counter
        self.precision = resolve_precision(config.precision, device)
        self.grads = GradientBuffer(model.parameters(), device)
        self.frames_per_step = config.batch_size * config.unroll_length / config.updates_per_batch
        """New transitions per optimizer step (the linear schedule's clock): a batch reused
        for K steps advances the clock by its frames once, not K times."""
        return_normalizer = parts.return_normalizer
        if return_normalizer is None and config.normalize_returns:
            return_normalizer = ReturnNormalizer()
        self.return_normalizer = return_normalizer
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    # ------------------------------------------------------------------ the loss

    def loss(
        self, batch: dict[str, torch.Tensor], core_state: tuple[torch.Tensor, ...], step: int = 0
    ):
        """Total loss and its parts for one time-major batch, as optimizer step ``step``
        (0-based) weighs them under the entropy schedule."""
        cfg = self.config
        entropy_cost = scheduled_entropy_cost(cfg, step, self.frames_per_step)
        t = cfg.unroll_length
        with autocast(self.device, self.precision):
            params_T1BP, values_T1B, _ = self.model(batch["obs"], batch["first"], core_state)
        # V-trace and the loss terms in fp32 whatever the forward pass ran in.
        params_T1BP, values_T1B = params_T1BP.float(), values_T1B.float()
        action_TB = batch["action"][:t]
        target_logp_TB, entropy_TB = self.head.log_prob_and_entropy(params_T1BP[:t], action_TB)
        behaviour_logp_TB = self.head.log_prob(batch["behaviour_params"][:t], action_TB)

        valid_TB = ~(batch["terminated"][:t] | batch["truncated"][:t])
        log_rhos_TB = torch.where(
            valid_TB, target_logp_TB.detach() - behaviour_logp_TB, float("-inf")
        )
        reward_TB = batch["reward"][1:]
        if cfg.reward_scale != 1.0:
            reward_TB = reward_TB * cfg.reward_scale
        if cfg.reward_clip is not None:
            reward_TB = reward_TB.clamp(-cfg.reward_clip, cfg.reward_clip)
        norm = self.return_normalizer
        scale = 1.0 if norm is None else norm.scale
        if norm is not None:
            reward_TB = norm.normalize(reward_TB)
        discount_TB = (~batch["terminated"][1:]).float() * cfg.discount

        vs_TB, pg_adv_TB = vtrace.from_importance_weights(
            log_rhos=log_rhos_TB,
            discounts=discount_TB,
            rewards=reward_TB,
            values=values_T1B[:t].detach(),
            bootstrap_value=values_T1B[t].detach(),
            clip_rho_threshold=cfg.clip_rho_threshold,
            clip_pg_rho_threshold=cfg.clip_pg_rho_threshold,
            lambda_=cfg.lambda_,
        )
        weight_TB = valid_TB.float()
        count = weight_TB.sum().clamp(min=1.0)
        if norm is not None:
            norm.update(vs_TB / scale, weight_TB)
        if cfg.normalize_advantages:
            mean = (pg_adv_TB * weight_TB).sum() / count
            std = (((pg_adv_TB - mean) * weight_TB).pow(2).sum() / count).sqrt()
            pg_adv_TB = (pg_adv_TB - mean) / (std + 1e-8)
        policy_loss = -(target_logp_TB * pg_adv_TB * weight_TB).sum() / count
        baseline_loss = 0.5 * ((vs_TB - values_T1B[:t]).pow(2) * weight_TB).sum() / count
        entropy = (entropy_TB * weight_TB).sum() / count
        total = policy_loss + cfg.baseline_cost * baseline_loss - entropy_cost * entropy
        with torch.no_grad():
            rho_mean = (log_rhos_TB.clamp(min=-20).exp() * weight_TB).sum() / count
        parts = {
            "loss_total": total.detach(),
            "loss_policy": policy_loss.detach(),
            "loss_baseline": baseline_loss.detach(),
            "loss_entropy": -entropy.detach(),
            "entropy": entropy.detach(),
            "rho_mean": rho_mean,
            "value_mean": (values_T1B[:t].detach() * weight_TB).sum() / count,
        }
        if norm is not None:
            parts["reward_norm_scale"] = torch.tensor(scale)
        if cfg.final_entropy_cost is not None:
            parts["entropy_cost"] = torch.tensor(entropy_cost)
        return total, parts

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
        batch: dict[str, torch.Tensor],
        core_state: tuple[torch.Tensor, ...],
        unrolls: Unrolls,
        step: int,
    ) -> dict[str, float] | None:
        """``train_step`` on ``unrolls`` already on the device as ``batch`` (see
        ``to_time_major``); ``step`` is the optimizer step the gradient is computed at."""
        total, parts = self.loss(batch, core_state, step)
        if not torch.isfinite(total):
            self._skip("loss")
            return None
        self.grads.zero()
        total.backward()
        grad_norm = self.grads.clip_norm(self.config.max_grad_norm)
        if not torch.isfinite(grad_norm):
            self.grads.zero()
            self._skip("gradient")
            return None
        lr = self.set_learning_rate(step)
        self.apply_update()
        scalars = {k: float(v) for k, v in parts.items()}
        scalars["grad_norm"] = float(grad_norm)
        scalars["learning_rate"] = lr
        scalars["policy_lag"] = policy_lag(step, unrolls)
        return scalars

    def apply_update(self) -> None:
        """The optimizer step on the clipped gradients, seen whole by inference."""
        with self.weights_lock:
            self.optimizer.step()
            self.model.bound_log_std_()
            self.step_counter.value += 1

    def set_learning_rate(self, step: int) -> float:
        """Set the scheduled learning rate of optimizer step ``step`` (0-based); returns it."""
        lr = scheduled_learning_rate(self.config, step, self.frames_per_step)
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
        return None

    # ------------------------------------------------------------------ the loop

    def run(self) -> None:
        """Take batches until stopped; every wait for data is timed (trainer_wait_data)."""
        batch_size = self.config.batch_size
        while not self._stop.is_set():
            with self.stats.timer("trainer_wait_data"):
                unrolls = self.queue.get(batch_size, timeout=0.1)
            if unrolls is None:
                continue
            with self.stats.timer("trainer_step"):
                results = self.train_batch(unrolls)
            for scalars in results:
                if scalars is not None:
                    self.stats.on_train_step(scalars)

    def _run_guarded(self) -> None:
        try:
            self.run()
        except BaseException as exc:  # surfaced by the learner's main loop
            self.error = exc
            log.exception("trainer thread failed")

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run_guarded, name="trainer", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self.queue.close()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def training_state(self) -> checkpoint.TrainingState:
        """Weights, optimizer state and step count as of the last whole step."""
        return checkpoint.capture(
            self.model, self.optimizer, self.weights_lock, lambda: self.step_counter.value,
            self.return_normalizer,
        )  # fmt: skip


def policy_lag(step: int, unrolls: Unrolls) -> float:
    """Mean over the batch's trained actions (rows ``0..T-1`` of every unroll) of the
    optimizer steps between the weights that chose the action and the weights
    (``step``) the gradient is computed with. 0: fully on-policy."""
    t = unrolls.acted_step.shape[1] - 1
    return float(step - unrolls.acted_step[:, :t].mean())


def scheduled_learning_rate(config: LearnerConfig, step: int, frames_per_step: float) -> float:
    """The learning rate of optimizer step ``step`` (0-based) under ``--lr-schedule``.

    Linear decays with the frames trained before the step, ``step * frames_per_step``,
    to 0 at ``--total-frames``, from ``--lr-decay-start`` of them on: a function of the
    step count alone, which checkpoints keep, so a resumed run continues it exactly.
    """
    if config.effective_lr_schedule == "constant":
        return config.learning_rate
    done, start = trained_fraction(config, step, frames_per_step), config.lr_decay_start
    return config.learning_rate * min(1.0, (1.0 - done) / (1.0 - start))


def scheduled_entropy_cost(config: LearnerConfig, step: int, frames_per_step: float) -> float:
    """The entropy-bonus weight of optimizer step ``step``: ``--entropy-cost``, or with
    ``--final-entropy-cost`` the line from one to the other over ``--total-frames``, on the
    learning rate's clock (so a resumed run continues it exactly)."""
    if config.final_entropy_cost is None:
        return config.entropy_cost
    done = trained_fraction(config, step, frames_per_step)
    return config.entropy_cost + (config.final_entropy_cost - config.entropy_cost) * done


def trained_fraction(config: LearnerConfig, step: int, frames_per_step: float) -> float:
    """Share of ``--total-frames`` trained before step ``step``, capped at 1 (the clock of
    the linear schedules)."""
    return min(1.0, step * frames_per_step / config.total_frames)


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
    # The fused kernel updates every parameter in one op, where the default pays per-op
    # overhead per parameter, which dominates for the small models here.
    fused = next(model.parameters()).device.type in ("cpu", "cuda")
    return torch.optim.Adam(
        model.parameters(), lr=config.learning_rate, eps=config.adam_eps, fused=fused
    )
