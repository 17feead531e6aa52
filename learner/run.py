"""Wires the learner together and runs it until a stop condition or a signal.

``serve`` reads top to bottom: build the parts (``learner.parts``), the trainer's host (by
default a child process on the CPU, ``learner.training.process_host``, a CUDA stream on
CUDA, ``learner.training.device_host``; a thread for torchrun ranks) and the serving side
(inference engine -> dynamic batcher -> gRPC servicer and server, :func:`build_serving`),
then supervise: every ``log_interval_s`` write metrics, update
progress, checkpoint, and decide when to stop. What differs between a lone learner and
one torchrun rank of several is a strategy passed in (:class:`RankMode`:
:class:`SingleRank` here, ``learner.training.distributed.RankSync``), not branches in the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from learner import failover
from learner.agents.base import Store
from learner.agents.models import resolve_precision
from learner.agents.policy import Policy, TorchPolicy
from learner.checkpointing import BestKeeper, Checkpointer
from learner.collapse import CollapseWatch
from learner.metrics import MetricsWriter, PrometheusSink, one_line
from learner.parts import Learner, build_learner, make_checkpointer
from learner.population.assignment import MemberSlots
from learner.population.pbt import EVENT_KEY, Exploiter, LiveMember, event_scalars
from learner.progress import Progress
from learner.serving.auto import frontends, resolve_serving
from learner.serving.batcher import DynamicBatcher, ProcessFn
from learner.serving.inference import InferenceEngine
from learner.serving.rows import ServedPolicy
from learner.serving.server import build_server, raise_open_file_limit, set_serving
from learner.serving.servicer import LearnerServicer
from learner.serving.tier import (
    ServingFailed,
    TierServing,
    build_tier,
    check_tier_supported,
    shared_bytes,
)
from learner.serving.tier_unrolls import model_rows
from learner.state import checkpoint
from learner.state.dataset import learner_recorder
from learner.state.stats import LearnerStats
from learner.state.trajectories import TrajectoryBuilder
from learner.training.device_host import DeviceHost
from learner.training.hosts import POLICY_PREFIX, PolicyHosts, ThreadHost, TrainerHost, trainer_mode
from learner.training.process_host import ProcessHost
from seedrl.config import LearnerConfig, to_json_dict
from seedrl.metrics import RunResult
from seedrl.security import check_bind_protected, check_metrics_bind_protected, config_auth_token
from seedrl.transport import offered_local_socket

if TYPE_CHECKING:
    from learner.serving.selfplay import SelfPlay

log = logging.getLogger(__name__)

SOLVED_WINDOW = 100
"""Episodes the target-return criterion needs before it can stop a run."""
TRAINER_FAILED = "trainer failed"


class RankMode(Protocol):
    """What one learner process is among its peers: the strategy ``serve`` is given.

    :class:`SingleRank` is a learner alone; ``learner.training.distributed.RankSync`` is one of
    several data-parallel torchrun ranks (shared initial state, lockstep trainer,
    totals over all ranks, rank 0 writes the checkpoint).
    """

    stop_reason: str
    """Why the ranks decided together to stop ("" while they go on)."""

    @property
    def rank_addresses(self) -> list[str]:
        """Every rank's address, offered to actors in GetInfo (empty: one rank)."""
        ...

    @property
    def writes_checkpoints(self) -> bool: ...
    def attach(self, learner: Learner) -> None:
        """Take part in the learner's initial state before anything serves."""
        ...

    def make_host(self, learner: Learner) -> TrainerHost:
        """Where the trainer runs (not started)."""
        ...

    def metrics(self) -> dict[str, Any]:
        """Extra keys for each metrics record."""
        ...

    def checkpoint_counters(self) -> tuple[int, int] | None:
        """(frames, episodes) for the checkpoint; None: this learner's own."""
        ...


class SingleRank:
    """A learner alone: its own counters, its checkpoint, the trainer its config asks for."""

    def __init__(self) -> None:
        self.stop_reason = ""
        self.rank_addresses: list[str] = []
        self.writes_checkpoints = True

    def attach(self, learner: Learner) -> None:
        pass

    def make_host(self, learner: Learner) -> TrainerHost:
        return choose_host(learner)

    def metrics(self) -> dict[str, Any]:
        return {}

    def checkpoint_counters(self) -> None:
        return None


def choose_host(learner: Learner) -> TrainerHost:
    """Where this config's trainer runs on the learner's device (not started): a child
    process, a thread beside inference, or its own CUDA stream."""
    if learner.several_policies:  # each policy its own trainer, on its own store
        return PolicyHosts({name: policy_host(learner, name) for name in learner.policies})
    return policy_host(learner, None)


def policy_host(learner: Learner, policy: str | None) -> TrainerHost:
    """The host of one policy's trainer (``policy`` None: the learner's only one)."""
    mode = trainer_mode(learner.config, learner.device)
    parts = learner.trainer_parts(policy)
    store = learner.queue if policy is None else learner.policies[policy].queue
    if mode == "thread":
        return ThreadHost(parts, store, learner.builder)
    if mode == "device":
        return DeviceHost(parts, store, learner.builder)
    return ProcessHost(parts, store, learner.builder)


def make_engine(
    learner: Learner, host: TrainerHost, builder: TrajectoryBuilder | None = None
) -> InferenceEngine:
    """The inference engine over the weights ``host`` gives inference, and the learner's
    builder (or ``builder``: the serving tier's model rows) and unroll store."""
    config = learner.config

    def acting(model: Any, seed: tuple[int, ...]) -> Policy:
        if config.greedy:  # serving without training: the most likely action, as evaluate plays
            precision = resolve_precision(config.precision, learner.device)
            return TorchPolicy(model, learner.head, learner.device, precision, True)
        return learner.agent.inference_policy(model, seed)

    policies: list[tuple[ServedPolicy, Store]] | None = None
    if not isinstance(host, PolicyHosts):  # a resumed run samples fresh noise
        policy = acting(host.inference_model, (config.seed, learner.step_counter.value))
    else:  # rows grouped by policy, each on its own weights
        policies = []
        for index, (own, slot) in enumerate(
            zip(host.hosts.values(), learner.policies.values(), strict=True)
        ):
            seed = (config.seed, slot.step_counter.value, *((index,) if index else ()))
            served = ServedPolicy(
                acting(own.inference_model, seed), own.inference_lock, slot.step_counter,
                slot.stats, own.refresh_weights,
            )  # fmt: skip
            policies.append((served, slot.queue))
        policy = policies[0][0].policy
    return InferenceEngine(
        policy, learner.builder if builder is None else builder, learner.queue, learner.stats,
        host.inference_lock, learner.step_counter,
        keep_unrolls=config.train,  # --no-train: nothing drains the queue
        refresh_weights=host.refresh_weights,  # with several policies: each its own
        normalizer=learner.normalizer,
        self_play=make_self_play(learner, host),
        recorder=learner.recorder,
        policies=policies,
        agent_policy=learner.agent_policy,
        members=None if learner.population is None else MemberSlots(len(learner.policies)),
    )  # fmt: skip


def make_exploiter(learner: Learner, host: TrainerHost) -> Exploiter | None:
    """With --population: exploit and explore over the members' trainers (threads of
    this process, :func:`~learner.training.hosts.trainer_mode`)."""
    if learner.population is None:
        return None
    assert isinstance(host, PolicyHosts)
    members = []
    for name, slot in learner.policies.items():
        own = host.hosts[name]
        assert isinstance(own, ThreadHost)
        members.append(LiveMember(slot, own.trainer.retune, own.trainer.between_updates))
    return Exploiter(learner.population, learner.agent, members, learner.member_agent)


def make_self_play(learner: Learner, host: TrainerHost) -> SelfPlay | None:
    """With --self-play: the opponents' side of inference, the snapshots' frozen weights
    stacked in models of the learner's shape on the device inference runs on."""
    league = learner.league
    if league is None:
        return None
    from learner.agents.ensemble import StackedModels
    from learner.serving.selfplay import SelfPlay

    config, source = learner.config, host.inference_model

    snapshots = StackedModels(source, config.precision)  # a copy: its weights go unused
    # Self-play calls only the chooser's `choose`, on the parameters the stack computed.
    chooser = learner.agent.inference_policy(source, (config.seed, 1))

    def current_weights() -> dict[str, torch.Tensor]:
        with host.inference_lock:
            return {k: v.detach().to("cpu", copy=True) for k, v in source.state_dict().items()}

    from learner.league.opponents import ScriptedRows

    observation = learner.env_spec.observation_space
    scripted = {i: ScriptedRows(player, observation) for i, player in league.scripted.items()}
    agents = len(learner.env_spec.agents)
    return SelfPlay(
        league, agents, config.snapshot_every, snapshots, chooser, current_weights,
        config.seed, scripted,
    )  # fmt: skip


@dataclass
class Serving:
    """The serving side, built together: engine -> batcher -> servicer -> gRPC server."""

    batcher: DynamicBatcher
    servicer: LearnerServicer
    server: Any
    port: int
    health: Any
    batching: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.server.start()
        await set_serving(self.health, True)

    def start_batching(self) -> None:
        self.batching = asyncio.create_task(self.batcher.run(), name="batcher")

    async def stop(self, reason: str, final: bool) -> None:
        """Every stream gets a Shutdown (and a moment to read it), then the server stops."""
        await set_serving(self.health, False)
        self.servicer.begin_shutdown(reason, final)
        await self.server.stop(grace=3.0)
        if self.batching is not None:
            self.batching.cancel()


def serving_mode(count: int, auto: bool) -> str:
    """How this learner serves, as its startup line says it."""
    mode = f"serving by {count} frontend{'s' * (count > 1)}" if count else "serving in this process"
    return f"{mode} [auto]" if auto else mode


def make_batcher(config: LearnerConfig, process: ProcessFn) -> DynamicBatcher:
    """The dynamic batcher in front of ``process``, sized and timed by ``config``."""
    return DynamicBatcher(
        process,
        config.inference_batch_size,
        config.inference_timeout_ms / 1000.0,
        config.inference_quorum,
    )


def build_serving(
    learner: Learner,
    trainer: TrainerHost,
    rank_addresses: list[str],
    local_address: str | None,
    auth_token: str | None,
) -> Serving | TierServing:
    config = learner.config
    if frontends(config):  # frontend processes serve and build unrolls; this one runs the model
        check_tier_supported(config, learner.env_spec)
        rows = model_rows(
            config, learner.builder, learner.normalizer, bool(learner.env_spec.agents),
            len(learner.policies) > 1,
        )  # fmt: skip
        engine = make_engine(learner, trainer, rows)
        return build_tier(
            config, learner.env_spec, learner.learner_run_id, engine, learner.builder,
            learner.stats, auth_token, local_address, rank_addresses,
        )  # fmt: skip
    engine = make_engine(learner, trainer)
    batcher = make_batcher(config, engine.process)
    servicer = LearnerServicer(
        config, learner.env_spec, batcher, engine, learner.builder, learner.stats,
        learner.learner_run_id, rank_addresses=rank_addresses,
        local_addresses=[local_address] if local_address else [],
    )  # fmt: skip
    server, port, health = build_server(config, servicer, auth_token, local_address)
    return Serving(batcher, servicer, server, port, health)


class StopRequest:
    """The first reason to stop wins; SIGINT/SIGTERM are one (a restart, not the end)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.reason = ""
        self.final = True
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            # Not available off the main thread (asyncio raises RuntimeError, uvloop
            # ValueError) or off Unix: then only the caller stops us.
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, self.request, f"signal {sig.name}", False)

    def request(self, reason: str, final: bool) -> None:
        if not self.event.is_set():
            self.reason, self.final = reason, final
            self.event.set()


def make_checkpoints(
    learner: Learner, trainer: TrainerHost, rank: RankMode, start: float
) -> Checkpointer:
    """This run's checkpointer: the trainer's state, the counters the rank records, written
    by the rank that writes checkpoints, under the learner's lease."""
    return make_checkpointer(
        learner,
        trainer.training_state,
        counters=rank.checkpoint_counters,
        keeper=BestKeeper.for_config(learner.config),
        writes=rank.writes_checkpoints,
        start=start,
    )


async def serve(
    config: LearnerConfig,
    ready: asyncio.Future[int] | None = None,
    rank: RankMode | None = None,
) -> RunResult:
    """Run a learner until it stops; ``ready`` receives the bound port once serving.

    Raises UnprotectedBindError before binding an open non-loopback address.

    ``rank`` says what this process is among data-parallel ranks (default: alone).
    Unless ``--no-local-socket``, TLS or a unix ``--bind``, it also listens on a unix
    socket that same-host actors switch to; the socket's directory goes with the learner.
    On a unix ``--bind`` the serving frontends' own sockets sit beside its path instead.
    """
    token = config_auth_token(config)  # the one place it is resolved
    check_bind_protected(config, token)
    check_metrics_bind_protected(config)
    raise_open_file_limit()  # before anything opens: every connection holds a descriptor
    if rank is None and (config.standby or config.resume):
        # A standby waits here, binding nothing, until the leader is gone (a lone learner:
        # torchrun ranks restart together, and rank 0's leader.json is not another learner).
        turn = await asyncio.to_thread(failover.standby_turn, config)
        if turn is None:
            return RunResult("the leader finished the run", 0, 0, 0, None, 0.0, False)
        config = turn
    with offered_local_socket(config.offers_local_socket, config.bind) as local:
        return await _serve(config, token, ready, rank or SingleRank(), local)


async def _serve(
    config: LearnerConfig,
    auth_token: str | None,
    ready: asyncio.Future[int] | None,
    rank: RankMode,
    local_address: str | None,
) -> RunResult:
    learner = build_learner(config)
    # --serving-processes auto becomes a number here, so config.json says what ran.
    asked = config
    config = learner.config = resolve_serving(
        asked, learner.env_spec,
        shared_bytes=lambda n: shared_bytes(
            asked, learner.builder, learner.normalizer, n, bool(learner.env_spec.agents),
            len(learner.policies) > 1,
        ),
    )  # fmt: skip
    serving_auto = asked.serving_frontends is None
    rank.attach(learner)
    learner.recorder = learner_recorder(config, learner.env_spec, learner.builder.overlap)
    logdir = Path(config.logdir)
    # Owner-only: checkpoints hold the weights, and the run's files are nobody else's business.
    logdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    failures: list[str] = []  # what this run could not do, for result.json
    try:  # a full disk keeps the old one whole, and the run goes on (as for checkpoints)
        with checkpoint.atomic_file(logdir / "config.json") as f:
            f.write((json.dumps(to_json_dict(config), indent=2) + "\n").encode())
    except OSError as exc:
        log.error("could not write %s: %s", logdir / "config.json", exc)
        failures.append(f"config.json: {one_line(exc)}")
    reserve = reserve_result(logdir)
    writer = _metrics_writer(config, logdir)  # a sink the config cannot have fails here
    trainer = rank.make_host(learner)
    serving = build_serving(learner, trainer, rank.rank_addresses, local_address, auth_token)
    stop = StopRequest()
    if isinstance(serving, TierServing):
        serving.on_failure = stop.request  # a frontend that keeps dying ends the run
    progress = Progress(config.progress, config.total_frames, config.target_return)
    if config.train:
        trainer.start()  # a trainer process is ready before the first actor is served
    await serving.start()
    # Everything built so far (torch, the model, the server) lives as long as the run.
    # Frozen, the collector stops walking it: with hundreds of streams, more objects
    # survive, full collections come often, and each one walked that whole heap.
    gc.collect()
    gc.freeze()
    serving.start_batching()
    precision = resolve_precision(config.precision, learner.device)
    print(
        f"seedrl learner listening on {config.bind}:{serving.port} (env {config.env}, "
        f"device {learner.device}, trainer {trainer.mode}, {precision}, "
        f"{serving_mode(frontends(config), serving_auto)})",
        flush=True,
    )
    if ready is not None and not ready.done():
        ready.set_result(serving.port)

    start = time.perf_counter()
    watch = CollapseWatch(learner.head.max_entropy, watch_return=not config.self_play)
    fence = None
    if rank.writes_checkpoints:  # the learner that owns the run directory says so
        own = failover.Leader(learner.learner_run_id, failover.own_address(config))
        fence = failover.Fence(logdir, own)
        learner.lease = fence  # every rename into the directory checks it, then and there
    checkpoints = make_checkpoints(learner, trainer, rank, start)
    try:
        await _supervise(
            learner, trainer, rank, stop, writer, progress, start, checkpoints, watch, fence,
            make_exploiter(learner, trainer),
        )  # fmt: skip
    finally:
        await serving.stop(stop.reason or "learner stopping", stop.final)
        trainer.stop()
        progress.close()
        if learner.recorder is not None:
            await asyncio.to_thread(learner.recorder.close)
        if not (fence is not None and fence.lost):  # a superseded learner writes nothing
            failures += await checkpoints.final()
        record = {
            **learner.stats.snapshot(len(learner.queue)), **learner.queue.metrics(),
            **rank.metrics(), **(learner.league.metrics() if learner.league else {}),
            **(policy_metrics(learner) if learner.several_policies else {}),
        }  # fmt: skip
        stats = learner.stats
        watch.check(
            record, stats.return_first, stats.return_best, stats.return_error, stats.return_spread
        )
        writer.write(record, learner.stats.drain_episodes())
        failures += writer.close()  # what the sinks dropped or could not close, each logged
        if learner.population is not None:
            failures += write_lineage(logdir)
    result = _result(learner, stop.reason, time.perf_counter() - start)
    print(summary_line(result), flush=True)
    # "final": the run ended for good, so a standby has nothing to take over.
    write_result(logdir, {**result.__dict__, "final": stop.final, "failures": failures}, reserve)
    if trainer.error is not None:
        raise RuntimeError("the trainer failed") from trainer.error
    if isinstance(serving, TierServing) and serving.failure:
        raise ServingFailed(serving.failure)
    return result


async def _supervise(
    learner: Learner,
    trainer: TrainerHost,
    rank: RankMode,
    stop: StopRequest,
    writer: MetricsWriter,
    progress: Progress,
    start: float,
    checkpoints: Checkpointer,
    watch: CollapseWatch,
    fence: failover.Fence | None = None,
    exploiter: Exploiter | None = None,
) -> None:
    """Every ``log_interval_s`` until stopped: a metrics record (with the collapse flags),
    progress, the stop conditions and, when due, the best checkpoint and the periodic one;
    a learner another has taken over from (``fence``) stops and writes nothing more;
    with a population (``exploiter``), the members due are checked first, and the
    record carries their values and this interval's exploit events."""
    config, stats = learner.config, learner.stats
    while not stop.event.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.event.wait(), config.log_interval_s)
        other = fence.superseded() if fence is not None else None
        if other is not None:
            log.error("the learner at %s took over %s; stopping", other.address, config.logdir)
            stop.request(f"superseded by the learner at {other.address}", False)
            break
        events = []
        if exploiter is not None and (plan := exploiter.due()):
            # A copy waits for its member's update in flight: not on the event loop.
            events = await asyncio.to_thread(exploiter.apply, plan, stats.frames)
        record = stats.snapshot(len(learner.queue))
        record.update(learner.queue.metrics())
        if exploiter is not None:
            record.update(exploiter.metrics())
            if events:
                record[EVENT_KEY] = events
                record.update(event_scalars(events))
        if learner.several_policies:
            record.update(policy_metrics(learner))
        record.update(trainer.metrics())
        record.update(rank.metrics())
        if learner.normalizer is not None:  # values the update bound clipped, so far
            record["obs_norm/clipped_values"] = learner.normalizer.clipped_values
        if learner.league is not None:
            record.update(learner.league.metrics())
        watch.check(
            record, stats.return_first, stats.return_best, stats.return_error, stats.return_spread
        )
        writer.write(record, stats.drain_episodes())
        progress.update(record)
        reason = _stop_condition(config, stats, start, trainer) or rank.stop_reason
        if reason:
            # A failed trainer is not a finished run: actors wait for the restart.
            stop.request(reason, reason != TRAINER_FAILED)
        await checkpoints.tick()


POLICY_KEYS = (
    "frames", "episodes", "episode_return_mean", "learner_steps", "learner_steps_per_s",
    "queue_unrolls", "trainer_wait_share", "nonfinite_skipped",
)  # fmt: skip
"""What each of several policies' own stats add to a record, beside its training scalars."""


def policy_metrics(learner: Learner) -> dict[str, Any]:
    """Each policy's own frames, episodes, steps and training scalars as
    ``policy/NAME/KEY``, and the learner's steps and stored unrolls as all policies'
    together."""
    record: dict[str, Any] = {
        "learner_steps": learner.learner_steps,
        "learner_steps_per_s": 0.0,
        "queue_unrolls": sum(len(slot.queue) for slot in learner.policies.values()),
    }
    generic = set(LearnerStats().snapshot()) - set(POLICY_KEYS)  # the learner's own say these
    for name, slot in learner.policies.items():
        own = slot.stats.snapshot(len(slot.queue))
        own.update(slot.queue.metrics())
        record["learner_steps_per_s"] += own["learner_steps_per_s"]
        for key, value in own.items():
            if key not in generic:
                record[f"{POLICY_PREFIX}{name}/{key}"] = value
    return record


RESULT_RESERVE = ".result.json.reserve"
RESULT_RESERVE_BYTES = 8192
"""Room kept for result.json from the start, so a disk that fills during the run still
takes the line that says the run is over (else a standby would take over a finished run)."""


def reserve_result(logdir: Path) -> Path | None:
    """Take the room result.json will need while the disk has it (None: it has not;
    result.json is then written as any file at the end)."""
    path = logdir / RESULT_RESERVE
    try:
        with open(path, "wb") as f:
            f.write(b" " * RESULT_RESERVE_BYTES)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        log.error("no room kept for %s (the run goes on): %s", failover.RESULT_FILE, exc)
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
        return None
    return path


def write_result(logdir: Path, done: dict[str, Any], reserve: Path | None) -> None:
    """Write result.json whole: into the room ``reserve`` kept (overwriting bytes the file
    holds takes no new space on a full disk), then renamed into place."""
    text = (json.dumps(done, indent=2) + "\n").encode()
    target = logdir / failover.RESULT_FILE
    if reserve is not None and len(text) <= RESULT_RESERVE_BYTES:
        try:
            with open(reserve, "r+b") as f:
                f.write(text)
                f.truncate()
                f.flush()
                os.fsync(f.fileno())
            os.replace(reserve, target)
            return
        except OSError as exc:
            log.error("could not write %s into the room kept for it: %s", target, exc)
    with checkpoint.atomic_file(target) as f:
        f.write(text)


def write_lineage(logdir: Path) -> list[str]:
    """A population run's lineage plot beside its metrics; what could not be drawn."""
    from learner.population.lineage import plot_lineage  # matplotlib: only at the end

    try:
        log.info("lineage plot: %s", plot_lineage(logdir))
    except (OSError, ValueError) as exc:
        log.error("could not plot the lineage of %s: %s", logdir, exc)
        return [f"lineage plot: {one_line(exc)}"]
    return []


def _metrics_writer(config: LearnerConfig, logdir: Path) -> MetricsWriter:
    writer = MetricsWriter.from_config(config, logdir)
    prometheus = writer.sink(PrometheusSink)
    if prometheus is not None:
        address = f"{config.metrics_bind}:{prometheus.port}"
        print(f"seedrl metrics on http://{address}/metrics", flush=True)
    return writer


def _result(learner: Learner, reason: str, wall: float) -> RunResult:
    config, stats = learner.config, learner.stats
    return RunResult(
        reason=reason,
        frames=stats.frames,
        learner_steps=learner.learner_steps,
        episodes=stats.episodes,
        episode_return_mean=stats.return_mean,
        wall_time_s=wall,
        solved=config.target_return is not None and _solved(config, stats),
    )


def _solved(config: LearnerConfig, stats: LearnerStats) -> bool:
    mean = stats.return_mean
    return (
        config.target_return is not None
        and len(stats.returns) >= SOLVED_WINDOW
        and mean is not None
        and mean >= config.target_return
    )


def _stop_condition(
    config: LearnerConfig, stats: LearnerStats, start: float, trainer: TrainerHost
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


async def run_rank(config: LearnerConfig, environ: Mapping[str, str] | None = None) -> RunResult:
    """Serve as one rank of a torchrun job: join the group, serve, compare at the end."""
    from learner.training.distributed import RankEnv, RankSync, rank_config

    env = RankEnv.from_environ(os.environ if environ is None else environ)
    if env is None:
        raise ValueError("run_rank needs WORLD_SIZE > 1 and RANK (set by torchrun)")
    sync = RankSync(env, rank_config(config, env))
    try:
        result = await serve(sync.config, rank=sync)
        sync.finish(result)
    finally:
        sync.close()
    return result
