"""The assembled parts of one learner process, and how they are built, restored and saved.

:class:`Learner` holds what serving and training share (model, optimizer, trajectory
builder, unroll queue, counters); :func:`build_learner` makes it from a config (restored
from the checkpoint with ``--resume``). The trainer thread, the trainer process, the
device trainer and the inference engine each take what they need from it, in one place
each; :func:`trainer_mode` says which trainer a config asks for.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from learner.agents.models import (
    ActionHead,
    ActorCritic,
    action_head,
    build_model,
    choose_torso,
    resolve_device,
)
from learner.agents.policy import set_compute_threads
from learner.serving.inference import StepCounter
from learner.state import checkpoint
from learner.state.normalize import ObservationNormalizer, ReturnNormalizer, normalized_space
from learner.state.stats import LearnerStats
from learner.state.trajectories import TrajectoryBuilder, UnrollQueue, stored_frame_stack
from learner.training.allocator import keep_freed_memory
from learner.training.trainer import Trainer, TrainerParts, apply_optimizer_settings, make_optimizer
from seedrl import codec, envs
from seedrl.config import LearnerConfig, to_json_dict

log = logging.getLogger(__name__)


@dataclass
class Learner:
    """The assembled parts of one learner process."""

    config: LearnerConfig
    env_spec: Any
    device: torch.device
    model: ActorCritic
    head: ActionHead
    optimizer: torch.optim.Optimizer
    stats: LearnerStats
    builder: TrajectoryBuilder
    queue: UnrollQueue
    step_counter: StepCounter
    weights_lock: threading.Lock
    normalizer: ObservationNormalizer | None = None
    return_normalizer: ReturnNormalizer | None = None
    learner_run_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def trainer_parts(self) -> TrainerParts:
        """What a trainer of this learner's shared model is built from."""
        return TrainerParts(
            config=self.config,
            model=self.model,
            head=self.head,
            optimizer=self.optimizer,
            device=self.device,
            queue=self.queue,
            stats=self.stats,
            weights_lock=self.weights_lock,
            step_counter=self.step_counter,
            return_normalizer=self.return_normalizer,
        )


def build_learner(config: LearnerConfig) -> Learner:
    """Model, optimizer and data path for ``config`` (restored from a checkpoint with --resume)."""
    keep_freed_memory()
    set_compute_threads(config.torch_threads)
    torch.manual_seed(config.seed)
    np.random.seed(config.seed)
    device = resolve_device(config.device)
    env_spec = envs.describe_env(config.env, config.env_kwargs)
    head = action_head(env_spec.action_space)
    lstm_size = config.lstm_size if config.lstm else 0
    obs_space = env_spec.observation_space
    obs_shape = codec.spec_shape(obs_space)
    normalizer = None
    if config.normalize_observations:  # the network (and the unrolls) see float32
        normalizer = ObservationNormalizer(obs_shape, obs_space.dtype)
        obs_space = normalized_space(obs_space)
    torso = choose_torso(env_spec.observation_space, config.model)
    model = build_model(obs_space, head, torso, config.hidden_sizes, lstm_size).to(device)
    optimizer = make_optimizer(model, config)
    stats = LearnerStats()
    step_counter = StepCounter()
    return_normalizer = ReturnNormalizer() if config.normalize_returns else None
    if config.resume and config.checkpoint_path.exists():
        saved = restore(
            config.checkpoint_path, model, optimizer, stats, step_counter, env_spec, normalizer
        )
        if return_normalizer is not None and "return_normalizer" in saved:
            return_normalizer.load_state_dict(saved["return_normalizer"])
        apply_optimizer_settings(optimizer, config)
        defaults = schedule_states(LearnerConfig())
        for key, state in schedule_states(config).items():
            # Older checkpoints: a missing schedule is assumed unchanged, and a setting
            # added since reads as its default, the behaviour it was trained under.
            saved_state = {**defaults[key], **saved[key]} if key in saved else state
            if saved_state != state:
                log.warning(
                    "the checkpoint's %s was %s; this run's flags say %s",
                    key.replace("_", " "), saved_state, state,
                )  # fmt: skip
    builder = TrajectoryBuilder(
        unroll_length=config.unroll_length,
        obs_shape=obs_shape,
        obs_dtype=obs_space.dtype,
        action_shape=head.action_shape,
        action_dtype=str(head.action_dtype).removeprefix("torch."),
        param_size=head.param_size,
        core_state_sizes=(lstm_size, lstm_size) if lstm_size else (),
        frame_stack=stored_frame_stack(config),
    )
    return Learner(
        config=config,
        env_spec=env_spec,
        device=device,
        model=model,
        head=head,
        optimizer=optimizer,
        stats=stats,
        builder=builder,
        queue=UnrollQueue(config.max_queue_unrolls),
        step_counter=step_counter,
        weights_lock=threading.Lock(),
        normalizer=normalizer,
        return_normalizer=return_normalizer,
    )


def make_trainer(learner: Learner, trainer_cls: Callable[..., Trainer] = Trainer) -> Trainer:
    """The trainer over a learner's shared model, queue and counters."""
    return trainer_cls(learner.trainer_parts())


def trainer_mode(config: LearnerConfig, device: torch.device, ranked: bool = False) -> str:
    """The trainer ``--trainer`` asks for on ``device``: process, thread or device.

    Torchrun ranks (``ranked``) train in a thread that steps in lockstep; any other
    explicit mode raises ValueError.
    """
    mode = config.trainer
    if ranked:
        if mode not in ("auto", "thread"):
            raise ValueError("torchrun ranks train in a thread: use --trainer auto or thread")
        return "thread"
    if mode == "auto":
        return "device" if device.type == "cuda" else "process"
    return mode


def restore(
    path: Path,
    model: ActorCritic,
    optimizer: torch.optim.Optimizer,
    stats: LearnerStats,
    step_counter: StepCounter,
    env_spec: Any = None,
    normalizer: ObservationNormalizer | None = None,
) -> dict[str, Any]:
    """Load a checkpoint into the parts and return it; a mismatch raises CheckpointError
    naming the file."""
    state = checkpoint.load(path)
    if env_spec is not None and "env_spec" in state:
        checkpoint.check_env(path, state["env_spec"], env_spec)
    saved_stats = state.get("obs_normalizer")
    if (saved_stats is None) != (normalizer is None):
        trained = "with" if saved_stats is not None else "without"
        raise checkpoint.CheckpointError(
            f"{path}: trained {trained} --normalize-observations; resume with the same "
            "setting, use another --logdir or drop --resume"
        )
    try:
        if normalizer is not None and saved_stats is not None:
            normalizer.load_state_dict(saved_stats)
        model.load_state_dict(state["model"])
        model.bound_log_std_()  # a checkpoint from before the bound was kept this way
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        frames, steps = int(state["frames"]), int(state["learner_steps"])
        episodes, returns = int(state["episodes"]), list(state.get("returns", []))
    except (RuntimeError, ValueError, KeyError, TypeError) as exc:
        raise checkpoint.CheckpointError(
            f"{path}: does not fit this model/config ({checkpoint.one_line(exc)}); "
            "use another --logdir or drop --resume"
        ) from exc
    stats.restore(frames=frames, steps=steps, episodes=episodes, returns=returns)
    step_counter.value = steps
    log.info("resumed from %s at frame %d, step %d", path, stats.frames, step_counter.value)
    return state


def save_checkpoint(
    learner: Learner,
    training: checkpoint.TrainingState | None = None,
    counters: tuple[int, int] | None = None,
) -> None:
    """Write the checkpoint of ``training`` (default: the learner's own model and optimizer).

    ``counters`` overrides (frames, episodes), e.g. all ranks' totals.
    """
    stats = learner.stats
    if training is None:
        training = checkpoint.capture(
            learner.model,
            learner.optimizer,
            learner.weights_lock,
            lambda: learner.step_counter.value,
            learner.return_normalizer,
        )
    frames, episodes = counters or (stats.frames, stats.episodes)
    extra: dict[str, Any] = schedule_states(learner.config)
    if learner.normalizer is not None:
        extra["obs_normalizer"] = learner.normalizer.state_dict()
    state = checkpoint.snapshot(
        training,
        frames=frames,
        episodes=episodes,
        returns=list(stats.returns),
        config=to_json_dict(learner.config),
        env_spec=learner.env_spec.SerializeToString(),
        model_spec=to_json_dict(learner.model.spec),
        **extra,
    )
    checkpoint.save(learner.config.checkpoint_path, state)
    kept = learner.config.history_checkpoint_path(frames)
    if kept is not None and not kept.exists():
        kept.parent.mkdir(parents=True, exist_ok=True)
        try:  # a link is atomic and free; the next save replaces checkpoint.pt, not it
            os.link(learner.config.checkpoint_path, kept)
        except OSError:  # a filesystem without hard links: copy, then rename into place
            partial = kept.with_name(f".{kept.name}.tmp-{os.getpid()}")
            shutil.copyfile(learner.config.checkpoint_path, partial)
            os.replace(partial, kept)


def schedule_states(config: LearnerConfig) -> dict[str, dict[str, Any]]:
    """What defines the learning rate and the entropy bonus at each step, by checkpoint key
    (the step count is saved anyway, so a resumed run with the same flags continues both
    schedules exactly)."""
    return {
        "lr_schedule": {
            "schedule": config.effective_lr_schedule,
            "learning_rate": config.learning_rate,
            "total_frames": config.total_frames,
            "decay_start": config.lr_decay_start,
        },
        "entropy_schedule": {
            "entropy_cost": config.entropy_cost,
            "final_entropy_cost": config.final_entropy_cost,
            # A constant bonus does not depend on the budget: a run extended to more frames
            # keeps the same schedule.
            "total_frames": config.total_frames if config.final_entropy_cost is not None else 0,
        },
    }
