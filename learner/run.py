"""Wires the learner together and runs it until a stop condition or a signal.

``build_learner`` makes the parts (model, trajectory builder, queue, batcher, trainer,
gRPC server); ``serve`` runs them: the event loop serves actors, the trainer (a child
process by default, see ``learner.trainer_process``; a thread for torchrun ranks)
learns, and a supervisor loop writes metrics, checkpoints and progress every
``log_interval_s`` and decides when to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import signal
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from learner import checkpoint
from learner.allocator import keep_freed_memory
from learner.batcher import DynamicBatcher
from learner.device_trainer import DeviceTrainer, copy_for_inference
from learner.inference import InferenceEngine, StepCounter
from learner.normalize import ObservationNormalizer, normalized_space
from learner.progress import Progress
from learner.server import LearnerServicer, build_server, set_serving
from learner.stats import LearnerStats
from learner.trainer import Trainer, apply_optimizer_settings, make_optimizer
from learner.trainer_process import TrainerProcess
from learner.trajectories import TrajectoryBuilder, UnrollQueue, stored_frame_stack
from seedrl import codec, envs
from seedrl.config import LearnerConfig, check_bind_protected, resolve_auth_token, to_json_dict
from seedrl.metrics import MetricsWriter, RunResult
from seedrl.models import (
    ActionHead,
    ActorCritic,
    action_head,
    build_model,
    choose_torso,
    resolve_device,
    resolve_precision,
)
from seedrl.policy import set_compute_threads
from seedrl.timing import process_rss_mb
from seedrl.transport import offered_local_socket

log = logging.getLogger(__name__)

SOLVED_WINDOW = 100
"""Episodes the target-return criterion needs before it can stop a run."""
TRAINER_FAILED = "trainer failed"


class RankSync(Protocol):
    """What serving needs of one data-parallel rank (``learner.distributed.RankSync``)."""

    addresses: list[str]
    stop_reason: str

    @property
    def is_main(self) -> bool: ...
    def attach(self, learner: Learner) -> None: ...
    def make_trainer(self, *args: Any, **kwargs: Any) -> Trainer: ...
    def metrics(self) -> dict[str, Any]: ...
    def checkpoint_counters(self) -> tuple[int, int]: ...


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
    learner_run_id: str = field(default_factory=lambda: uuid.uuid4().hex)


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
    if config.resume and config.checkpoint_path.exists():
        saved = restore(
            config.checkpoint_path, model, optimizer, stats, step_counter, env_spec, normalizer
        )
        apply_optimizer_settings(optimizer, config)
        lr_state = lr_schedule_state(config)
        saved_lr_state = saved.get("lr_schedule", lr_state)
        if saved_lr_state != lr_state:
            log.warning(
                "the checkpoint's learning-rate schedule was %s; this run's flags say %s",
                saved_lr_state, lr_state,
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
    )


def make_trainer(learner: Learner, trainer_cls: Callable[..., Trainer] = Trainer) -> Trainer:
    """The trainer over a learner's shared model, queue and counters."""
    return trainer_cls(
        learner.config, learner.model, learner.head, learner.optimizer, learner.device,
        learner.queue, learner.stats, learner.weights_lock, learner.step_counter,
    )  # fmt: skip


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
            f"{path}: does not fit this model/config ({type(exc).__name__}: {exc}); "
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
        )
    frames, episodes = counters or (stats.frames, stats.episodes)
    extra: dict[str, Any] = {"lr_schedule": lr_schedule_state(learner.config)}
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


def lr_schedule_state(config: LearnerConfig) -> dict[str, Any]:
    """What defines the learning rate at each step (saved with checkpoints; the step count
    is saved anyway, so a resumed run with the same flags continues the schedule exactly)."""
    return {
        "schedule": config.lr_schedule,
        "learning_rate": config.learning_rate,
        "total_frames": config.total_frames,
    }


def trainer_mode(config: LearnerConfig, device: torch.device, ranked: bool) -> str:
    """The trainer ``--trainer`` asks for on ``device``: process, thread or device."""
    mode = config.trainer
    if ranked:
        if mode not in ("auto", "thread"):
            raise ValueError("torchrun ranks train in a thread: use --trainer auto or thread")
        return "thread"
    if mode == "auto":
        return "device" if device.type == "cuda" else "process"
    return mode


def choose_trainer(
    learner: Learner, rank: RankSync | None, inference_model: ActorCritic | None = None
) -> Trainer | TrainerProcess | DeviceTrainer:
    """The trainer this config asks for (not started): a child process, or a thread.

    The device trainer needs ``inference_model``, the copy of the weights inference runs.
    """
    mode = trainer_mode(learner.config, learner.device, rank is not None)
    if rank is not None:
        return make_trainer(learner, rank.make_trainer)
    if mode == "thread":
        return make_trainer(learner)
    if mode == "device":
        if inference_model is None:
            raise ValueError("the device trainer needs the inference copy of the model")
        return DeviceTrainer(
            learner.config, learner.model, learner.head, learner.optimizer, learner.device,
            learner.queue, learner.stats, learner.weights_lock, learner.step_counter,
            inference_model, learner.builder,
        )  # fmt: skip
    return TrainerProcess(
        learner.config, learner.model, learner.head, learner.optimizer, learner.builder,
        learner.queue, learner.stats, learner.weights_lock, learner.step_counter,
    )  # fmt: skip


def write_checkpoint(
    learner: Learner,
    trainer: Trainer | TrainerProcess | DeviceTrainer,
    counters: tuple[int, int] | None,
) -> None:
    """Checkpoint the trainer's current state; a dead trainer process leaves the last one."""
    training = trainer.training_state()
    if training is None:
        log.error(
            "no checkpoint written: the trainer process died; %s stays as it was",
            learner.config.checkpoint_path,
        )
        return
    save_checkpoint(learner, training, counters)


async def serve(
    config: LearnerConfig,
    ready: asyncio.Future[int] | None = None,
    rank_addresses: list[str] | None = None,
    rank: RankSync | None = None,
) -> RunResult:
    """Run a learner until it stops; ``ready`` receives the bound port once serving.

    Raises UnprotectedBindError before binding an open non-loopback address.

    With ``rank`` (learner.distributed) this process is one of several data-parallel ranks.
    Unless ``--no-local-socket``, TLS or a unix ``--bind``, it also listens on a unix
    socket that same-host actors switch to; the socket's directory goes with the learner.
    """
    check_bind_protected(config, resolve_auth_token(config.auth_token))
    with offered_local_socket(config.local_socket and not config.tls_cert, config.bind) as local:
        return await _serve(config, ready, rank_addresses, rank, local)


async def _serve(
    config: LearnerConfig,
    ready: asyncio.Future[int] | None,
    rank_addresses: list[str] | None,
    rank: RankSync | None,
    local_address: str | None,
) -> RunResult:
    if rank is not None and config.normalize_observations:
        raise ValueError(
            "--normalize-observations is not supported with torchrun ranks (each rank "
            "would normalize by its own frames)"
        )
    learner = build_learner(config)
    if rank is not None:
        rank.attach(learner)
        rank_addresses = rank.addresses
    writes_checkpoints = rank is None or rank.is_main
    stats, logdir = learner.stats, Path(config.logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    (logdir / "config.json").write_text(json.dumps(to_json_dict(config), indent=2) + "\n")

    mode = trainer_mode(config, learner.device, rank is not None)
    # The device trainer keeps a second copy of the weights on the device for inference,
    # touched only by the event loop, so inference's forward pass needs no shared lock.
    inference_model = copy_for_inference(learner.model) if mode == "device" else learner.model
    inference_lock = threading.Lock() if mode == "device" else learner.weights_lock
    precision = resolve_precision(config.precision, learner.device)
    engine = InferenceEngine(
        inference_model, learner.head, learner.device, learner.builder, learner.queue, stats,
        inference_lock, learner.step_counter, config.inference_backend,
        (config.seed, learner.step_counter.value),  # a resumed run samples fresh noise
        learner.normalizer,
        precision,
    )  # fmt: skip
    engine.keep_unrolls = config.train  # --no-train: nothing drains the queue
    batcher = DynamicBatcher(
        engine.process,
        config.inference_batch_size,
        config.inference_timeout_ms / 1000.0,
        config.inference_quorum,
    )
    servicer = LearnerServicer(
        config, learner.env_spec, batcher, engine, learner.builder, stats, learner.learner_run_id
    )
    servicer.rank_addresses = list(rank_addresses or [])
    server, port, health = build_server(
        config, servicer, resolve_auth_token(config.auth_token), local_address
    )
    trainer = choose_trainer(learner, rank, inference_model)
    if isinstance(trainer, TrainerProcess | DeviceTrainer):
        engine.refresh_weights = trainer.refresh_weights

    stop = asyncio.Event()
    stop_reason = ""
    stop_final = True

    def request_stop(reason: str, final: bool) -> None:
        nonlocal stop_reason, stop_final
        if not stop.is_set():
            stop_reason, stop_final = reason, final
            stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        # Not available off the main thread (asyncio raises RuntimeError, uvloop
        # ValueError) or off Unix: then only the caller stops us.
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, request_stop, f"signal {sig.name}", False)

    prometheus = (config.bind, config.metrics_port) if config.metrics_port else None
    writer = MetricsWriter(logdir, tensorboard=config.tensorboard, prometheus=prometheus)
    if writer.prometheus is not None:
        print(
            f"seedrl metrics on http://{config.bind}:{writer.prometheus.port}/metrics", flush=True
        )
    progress = Progress(config.progress, config.total_frames, config.target_return)
    if config.train:
        trainer.start()  # a trainer process is ready before the first actor is served
    await server.start()
    await set_serving(health, True)
    # Everything built so far (torch, the model, the server) lives as long as the run.
    # Frozen, the collector stops walking it: with hundreds of streams, more objects
    # survive, full collections come often, and each one walked that whole heap.
    gc.collect()
    gc.freeze()
    batcher_task = asyncio.create_task(batcher.run(), name="batcher")
    address = f"{config.bind}:{port}"
    print(
        f"seedrl learner listening on {address} (env {config.env}, device {learner.device},"
        f" trainer {mode}, {precision})",
        flush=True,
    )
    if ready is not None and not ready.done():
        ready.set_result(port)

    start = time.perf_counter()
    last_checkpoint = start
    try:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), config.log_interval_s)
            record = stats.snapshot(len(learner.queue))
            if isinstance(trainer, TrainerProcess) and trainer.alive:
                record["trainer_rss_mb"] = process_rss_mb(trainer.pid)
            if rank is not None:
                record.update(rank.metrics())
            writer.write(record)
            progress.update(record)
            reason = _stop_condition(config, stats, start, trainer)
            if rank is not None and not reason:
                reason = rank.stop_reason
            if reason:
                # A failed trainer is not a finished run: actors wait for the restart.
                request_stop(reason, reason != TRAINER_FAILED)
            due = time.perf_counter() - last_checkpoint >= config.checkpoint_interval_s
            if due and writes_checkpoints:
                counters = rank.checkpoint_counters() if rank is not None else None
                try:
                    await asyncio.to_thread(write_checkpoint, learner, trainer, counters)
                except OSError as exc:  # a full disk should not end the run; the old one stays
                    log.error("could not write checkpoint %s: %s", config.checkpoint_path, exc)
                last_checkpoint = time.perf_counter()
    finally:
        await set_serving(health, False)
        servicer.begin_shutdown(stop_reason or "learner stopping", stop_final)
        await server.stop(grace=3.0)
        batcher_task.cancel()
        trainer.stop()
        progress.close()
        if writes_checkpoints:
            counters = rank.checkpoint_counters() if rank is not None else None
            await asyncio.to_thread(write_checkpoint, learner, trainer, counters)
        final = stats.snapshot(len(learner.queue))
        if rank is not None:
            final.update(rank.metrics())
        writer.write(final)
        writer.close()
    wall = time.perf_counter() - start
    solved = config.target_return is not None and _solved(config, stats)
    result = RunResult(
        reason=stop_reason,
        frames=stats.frames,
        learner_steps=learner.step_counter.value,
        episodes=stats.episodes,
        episode_return_mean=stats.return_mean,
        wall_time_s=wall,
        solved=solved,
    )
    print(summary_line(result), flush=True)
    (logdir / "result.json").write_text(json.dumps(result.__dict__, indent=2) + "\n")
    if trainer.error is not None:
        raise RuntimeError("the trainer failed") from trainer.error
    return result


def _solved(config: LearnerConfig, stats: LearnerStats) -> bool:
    mean = stats.return_mean
    return (
        config.target_return is not None
        and len(stats.returns) >= SOLVED_WINDOW
        and mean is not None
        and mean >= config.target_return
    )


def _stop_condition(
    config: LearnerConfig, stats: LearnerStats, start: float, trainer: Trainer | TrainerProcess
) -> str:
    if config.total_frames and stats.frames >= config.total_frames:
        return f"reached {config.total_frames} frames"
    if _solved(config, stats):
        return f"mean return of the last {SOLVED_WINDOW} episodes reached {config.target_return}"
    if config.max_seconds and time.perf_counter() - start >= config.max_seconds:
        return f"reached {config.max_seconds:.0f} s"
    if config.train and trainer.error is not None:
        return TRAINER_FAILED
    return ""


def summary_line(result: RunResult) -> str:
    ret = "-" if result.episode_return_mean is None else f"{result.episode_return_mean:.1f}"
    return (
        f"seedrl done: {result.reason}; frames {result.frames}, learner steps "
        f"{result.learner_steps}, episodes {result.episodes}, mean return {ret}, "
        f"wall time {result.wall_time_s:.1f} s"
    )
