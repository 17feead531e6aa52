"""An actor: step K envs, stream each frame to the learner, apply its actions.

The step loop (``Actor._stream_frames``) is: join K observations/rewards/flags into one
frame's bytes -> send it and wait for the K actions (one gRPC round trip, on this
thread: ``actors.stream``) -> step the envs. Where the learner offers it (stacked Atari
frames), a frame carries only the newest frame of each observation; the learner has the
rest. A process runs one actor, or several on a thread each (``actors.process``; the
launcher decides). The actor holds no model. When the
learner is unreachable or restarts, the actor reconnects with capped exponential backoff
and jitter, under a fresh ``run_id`` so the learner resets its slots; it exits only when
the learner says training is finished (or on a signal).

Shape suffixes: K envs in this actor, O observation dims, A action dims.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import random
import socket
import threading
import time
import uuid
from typing import Any

import grpc
import gymnasium as gym
import numpy as np
from google.protobuf.message import DecodeError

from actors.roundtrip import RoundTripStats
from actors.stream import ActorStream, StreamError, open_stream
from seedrl import PROTOCOL_VERSION, codec, envs
from seedrl.config import ActorConfig
from seedrl.proto import seedrl_pb2 as pb
from seedrl.proto import seedrl_pb2_grpc as pb_grpc
from seedrl.security import config_auth_token
from seedrl.transport import (
    ACT_METHOD,
    auth_metadata,
    client_channel,
    learner_targets,
    local_target,
    pick_rank,
)

log = logging.getLogger(__name__)

RETRYABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
    }
)
"""Statuses after which the actor reconnects; anything else is a configuration error."""
GONE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
"""Statuses that say the learner is not there (down, unreachable): an actor with
``--fallback-learner`` tries its next address after them; a full or refusing learner is there."""


class StreamEnd(enum.Enum):
    FINISHED = "learner finished training"
    LEARNER_STOPPING = "learner stopping (restart expected)"
    CLOSED = "stream closed by the learner"
    MAX_FRAMES = "actor reached --max-frames"
    STOPPED = "actor told to stop"


class Backoff:
    """Capped exponential backoff with full jitter (AWS architecture blog's recipe)."""

    def __init__(self, initial: float = 0.1, cap: float = 30.0, rng: random.Random | None = None):
        self.initial = initial
        self.cap = cap
        self.attempt = 0
        self._rng = rng or random.Random()

    def next_delay(self) -> float:
        ceiling = min(self.cap, self.initial * 2**self.attempt)
        self.attempt += 1
        return self._rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.attempt = 0


def action_limit(spec: pb.SpaceSpec) -> int | np.ndarray | None:
    """What an integer action leaf's values must stay below (its lowest is 0: the codec
    refuses other starts); None for a Box, whose actions need only be finite."""
    if spec.kind == "discrete":
        return int(spec.n)
    if spec.kind == "multi_discrete":
        return np.asarray(spec.nvec, np.int64).reshape(codec.spec_shape(spec))
    if spec.kind == "multi_binary":
        return 2
    return None


def check_actions(actions_KA: np.ndarray, limit: int | np.ndarray | None, name: str) -> None:
    """Raise WireError for actions outside the action space, before an env steps on them.

    A Box action may lie out of bounds (a Gaussian policy's samples do; the actor clips
    them) but never NaN or inf; a discrete one must be an index into its space. One
    vectorised test per message; the search for the culprit runs only when it fails.
    """
    if limit is None:
        if np.isfinite(actions_KA).all():
            return
        row = int(np.argwhere(~np.isfinite(actions_KA))[0][0])
        what = "a non-finite Box action"
    else:
        bad_KA = (actions_KA < 0) | (actions_KA >= limit)
        if not bad_KA.any():
            return
        row = int(np.argwhere(bad_KA)[0][0])
        bounds = (
            f"[0, {limit})" if np.ndim(limit) == 0 else f"[0, nvec {np.asarray(limit).tolist()})"
        )
        what = f"an action outside {bounds}"
    raise codec.WireError(
        f"the learner sent {what} for row {row}{name}: {np.asarray(actions_KA[row]).tolist()}"
    )


class StepWire:
    """One stream's frames and replies as bytes, for K envs of one env spec.

    Frames are joined from, and replies split against, the wire's fixed bytes: no
    message objects per step. A reply that misses the template is parsed in full. A
    multi-agent env's frames carry K * A rows (one per agent of each env) and the acting
    flags.
    """

    def __init__(self, spec: pb.EnvSpec, k: int, frame_stack: int = 0) -> None:
        act_spec, obs_spec = spec.action_space, spec.observation_space
        self.act_spec, self.obs_spec = act_spec, obs_spec
        self.structured_obs = codec.is_structured(obs_spec)
        self.structured_act = codec.is_structured(act_spec)
        self.multi_agent = bool(spec.agents)
        k = k * codec.rows_per_env(spec)  # rows: from here on, K counts rows
        acting = codec.tensor_layout(np.bool_, (k,)) if self.multi_agent else None
        self.k = k
        self.acting: np.ndarray | None = None
        """A multi-agent env's acting rows, which each frame carries: the env's own array
        (``AgentEnvs.acting``), updated in place by every step."""
        act_leaves = codec.space_leaves(act_spec, action=True)
        self.act_dtype = act_leaves[0].dtype
        self.act_shape = (k, *act_leaves[0].shape)
        self.low, self.high = codec.action_bounds(act_spec)
        self.limit = action_limit(act_leaves[0].spec)
        self.newest_of_stack = 0
        """D when frames carry the newest of D stacked frames (said in the Hello), else 0."""
        if self.structured_obs:
            self.obs_leaves = codec.space_leaves(obs_spec)
            rewards, flags = codec.frame_layouts(k, np.float32, ())[1:]
            leaves = codec.leaf_layouts(k, self.obs_leaves)
            self._frame = codec.structured_frame_template(leaves, rewards, flags, acting)
        else:
            self.obs_dtype = np.dtype(obs_spec.dtype)
            obs_shape = codec.spec_shape(obs_spec)
            # The learner's offer (frame_stack D > 1) is taken where observations are D-frame
            # stacks: then each frame carries the newest frame of each only.
            newest = frame_stack > 1 and len(obs_shape) > 1 and obs_shape[0] == frame_stack
            self.newest_of_stack = frame_stack if newest else 0
            sent_shape = obs_shape[1:] if newest else obs_shape
            layouts = codec.frame_layouts(k, self.obs_dtype, sent_shape)
            self._frame = codec.frame_template(*layouts, acting)
        if self.structured_act:
            self.act_leaves = act_leaves
            self._act_layouts = codec.leaf_layouts(k, act_leaves)
            self._act_bounds = [codec.action_bounds(leaf.spec) for leaf in act_leaves]
            self._act_limits = [action_limit(leaf.spec) for leaf in act_leaves]
            self._actions = codec.actions_leaves_template(self._act_layouts)
        else:
            self._actions = codec.actions_template(self.act_dtype, self.act_shape)

    def frame(
        self, obs_KO: Any, reward_K: np.ndarray, terminated_K: np.ndarray, truncated_K: np.ndarray
    ) -> bytes:
        """The serialized ActorMessage carrying one Frame (and :attr:`acting`, if set)."""
        tail = () if self.acting is None else (self.acting.tobytes(),)
        if self.structured_obs:
            leaves = codec.flatten_values(self.obs_spec, obs_KO)
            return self._frame.fill(
                (
                    reward_K.tobytes(),
                    terminated_K.tobytes(),
                    truncated_K.tobytes(),
                    *(
                        np.asarray(v, dtype=leaf.dtype).tobytes()
                        for v, leaf in zip(leaves, self.obs_leaves, strict=True)
                    ),
                    *tail,
                )
            )
        if self.newest_of_stack:
            obs_KO = obs_KO[:, -1]
        return self._frame.fill(
            (
                np.asarray(obs_KO, dtype=self.obs_dtype).tobytes(),
                reward_K.tobytes(),
                terminated_K.tobytes(),
                truncated_K.tobytes(),
                *tail,
            )
        )

    def actions(self, data: bytes) -> Any:
        """The K actions of a reply (clipped to a Box's bounds), or the learner's Shutdown.

        A dict/tuple action space gives dicts and tuples of ``[K, *leaf_shape]`` arrays.
        Actions outside the action space raise WireError (:func:`check_actions`).
        """
        if self.structured_act:
            return self._structured_actions(data)
        payloads = self._actions.split(data)
        if payloads is not None:
            actions_KA = np.frombuffer(payloads[0], self.act_dtype).reshape(self.act_shape)
        else:
            reply = parse_reply(data)
            if reply.WhichOneof("kind") == "shutdown":
                return reply.shutdown
            tensor = reply.actions.actions
            actions_KA = codec.decode_tensor(tensor, "actions", self.act_dtype, self.act_shape)
        check_actions(actions_KA, self.limit, "")
        if self.low is not None:
            actions_KA = np.clip(actions_KA, self.low, self.high)
        return actions_KA

    def _structured_actions(self, data: bytes) -> Any:
        payloads = self._actions.split(data)
        if payloads is not None:
            arrays = [
                np.frombuffer(p, x.dtype).reshape(x.shape)
                for p, x in zip(payloads, self._act_layouts, strict=True)
            ]
        else:
            reply = parse_reply(data)
            if reply.WhichOneof("kind") == "shutdown":
                return reply.shutdown
            tensors = reply.actions.action_leaves
            if len(tensors) != len(self.act_leaves):
                raise codec.WireError(
                    f"actions: {len(tensors)} leaves but the action space has "
                    f"{len(self.act_leaves)}"
                )
            arrays = [
                codec.decode_tensor(t, f"actions {leaf.name}", x.dtype, x.shape)
                for t, leaf, x in zip(tensors, self.act_leaves, self._act_layouts, strict=True)
            ]
        for i, (low, high) in enumerate(self._act_bounds):
            check_actions(arrays[i], self._act_limits[i], f" of leaf {self.act_leaves[i].name!r}")
            if low is not None:
                arrays[i] = np.clip(arrays[i], low, high)
        return codec.unflatten_values(self.act_spec, arrays)


class Actor:
    """State that survives reconnects: the envs, the frame count, the backoff."""

    def __init__(self, config: ActorConfig, index: int) -> None:
        self.config = config
        self.index = index
        prefix = config.actor_id or f"{socket.gethostname()}-{os.getpid()}"
        self.actor_id = f"{prefix}-{index}"
        self.token = config_auth_token(config)
        self.metadata = auth_metadata(self.token)
        self.backoff = Backoff(cap=config.max_backoff_s)
        # Several learner ranks: a list spreads actors by index; one address is rank 0's,
        # and GetInfo's rank_addresses then says which rank this actor belongs to.
        targets = learner_targets(config.learner)
        self.discover_ranks = len(targets) == 1
        self.addresses = [targets[index % len(targets)], *learner_targets(config.fallback_learner)]
        """This actor's learner, then the standbys it fails over to (--fallback-learner)."""
        self._address = 0
        self.home = self.addresses[0]
        self.target = self.home
        self.local_failed = False
        """The learner's unix socket did not work for this actor: stay on TCP."""
        self._connections_before_local = -1
        self.frames = 0
        self.connections = 0
        self.round_trips = RoundTripStats(directory=config.stats_dir)
        self.vec_env: gym.vector.VectorEnv | None = None
        self._env_key: tuple[str, str] | None = None
        self._env_spec: pb.EnvSpec | None = None
        self._stop = threading.Event()
        self._stream: ActorStream | None = None
        self.num_envs = config.envs_per_actor
        """K: the envs this actor steps (0 until GetInfo said, when --envs-per-actor left it)."""

    def stop(self) -> None:
        """Make ``run`` return 0 soon; safe from another thread (not from a signal handler).

        Cancels the open stream, so a read waiting on a silent learner ends too.
        """
        self._stop.set()
        stream = self._stream  # set before run checks the flag: one of the two sees the other
        if stream is not None:
            stream.cancel()

    # ---------------------------------------------------------------- envs

    def _ensure_envs(self, info: pb.LearnerInfo) -> pb.EnvSpec:
        """Build (or rebuild, if the learner changed env) the K envs; check spaces agree.

        Raises EnvNotAllowed, before importing anything, for an env id this host did not
        allow (``--allow-env-module``), and EnvError for one it cannot build (an unknown
        id, a family whose extra is not installed here)."""
        key = (info.env.env_id, info.env.env_kwargs_json)
        if self.vec_env is None or key != self._env_key:
            # Before anything is imported: the learner's env id may name code to run here.
            envs.check_env_allowed(info.env.env_id, self.config.allow_env_module, "the learner")
            if self.vec_env is not None:
                self.vec_env.close()
            kwargs = json.loads(info.env.env_kwargs_json or "{}")
            k = self.num_envs = choose_num_envs(self.config, info, self.actor_id)
            self.vec_env = envs.make_vector_env(info.env.env_id, kwargs, k)
            mine = codec.env_spec(
                info.env.env_id,
                kwargs,
                self.vec_env.single_observation_space,
                self.vec_env.single_action_space,
                agents=getattr(self.vec_env, "agent_ids", ()),
            )
            self._env_key = key
            self._env_spec = mine
            self._seeded = False
        assert self._env_spec is not None
        return self._env_spec

    # ---------------------------------------------------------------- connection loop

    @property
    def on_local_socket(self) -> bool:
        """Connected (or connecting) through the learner's unix socket, not --learner."""
        return self.target != self.home and self.target.startswith("unix:")

    def _usable_local_socket(self, info: pb.LearnerInfo) -> str | None:
        if not self.config.local_socket or self.local_failed:
            return None
        return local_target(info.local_address, self.target)

    def run(self) -> int:
        """Connect, stream, reconnect; returns the process exit code."""
        cfg = self.config
        while not self._stop.is_set():
            channel = client_channel(
                self.target, cfg.tls_ca, cfg.tls_server_name,
                tls_cert=cfg.tls_cert, tls_key=cfg.tls_key,
            )  # fmt: skip
            try:
                stub = pb_grpc.LearnerStub(channel)
                info = stub.GetInfo(pb.GetInfoRequest(), metadata=self.metadata, timeout=10)
                if not self.on_local_socket:
                    rank = pick_rank(info.rank_addresses, self.index, self.home)
                    if self.discover_ranks and rank != self.target:
                        log.info("actor %s: using learner rank at %s", self.actor_id, rank)
                        self.target = rank
                        continue
                    local = self._usable_local_socket(info)
                    if local is not None:
                        log.info("actor %s: learner on this host, using %s", self.actor_id, local)
                        self.target = local
                        self._connections_before_local = self.connections
                        continue
                spec = self._ensure_envs(info)
                end = self.stream_frames(channel, spec, info.frame_stack)
            except grpc.RpcError as exc:
                if self._stop.is_set():
                    return 0
                code, details = _status_of(exc)
                never_streamed = self.connections == self._connections_before_local
                unavailable = code is grpc.StatusCode.UNAVAILABLE
                if self.on_local_socket and never_streamed and unavailable:
                    # The socket exists but does not take us (another user's learner, a
                    # stale file): TCP worked a moment ago, so use it from now on.
                    log.warning(
                        "actor %s: cannot use the learner's local socket %s (%s); staying on TCP",
                        self.actor_id, self.target, details,
                    )  # fmt: skip
                    self.local_failed = True
                    self.target = self.home
                    continue
                if code not in RETRYABLE:
                    log.error(
                        "actor %s: learner refused: %s: %s", self.actor_id, code.name, details
                    )
                    return 2
                # The first failure of a series is a warning, so a wrong address or TLS CA
                # is visible at the default log level; the retries after it are not.
                level = logging.WARNING if self.backoff.attempt == 0 else logging.INFO
                if code in GONE:
                    self._fail_over(details, level)
                self.target = self.home  # find the ranks again once the learner is back
                delay = self.backoff.next_delay()
                log.log(
                    level, "actor %s: learner unavailable (%s: %s); retrying in %.1f s",
                    self.actor_id, code.name, details, delay,
                )  # fmt: skip
                self._stop.wait(delay)
                continue
            except codec.WireError as exc:
                # A reply that breaks the contract (actions outside the action space): this
                # connection ends, the envs never see it; the backoff grows until a
                # connection's actions are stepped, so such a learner gets no tight loop.
                delay = self.backoff.next_delay()
                log.warning(
                    "actor %s: bad reply from the learner at %s (%s); reconnecting in %.1f s",
                    self.actor_id, self.target, exc, delay,
                )  # fmt: skip
                self.target = self.home
                self._stop.wait(delay)
                continue
            except envs.EnvError as exc:  # refused or unbuildable: retrying won't help
                log.error("actor %s: %s", self.actor_id, exc)
                return 2
            finally:
                self.round_trips.flush(self.actor_id, self.num_envs)
                channel.close()
            log.info("actor %s: %s after %d frames", self.actor_id, end.value, self.frames)
            if end in (StreamEnd.FINISHED, StreamEnd.MAX_FRAMES, StreamEnd.STOPPED):
                return 0
            if end is StreamEnd.LEARNER_STOPPING and cfg.exit_on_shutdown:
                return 0
            self.target = self.home
            self._stop.wait(self.backoff.next_delay())
        return 0

    def _fail_over(self, details: str, level: int) -> None:
        """Make the next --fallback-learner address home (wrapping around), if there is one."""
        if len(self.addresses) < 2:
            return
        gone = self.home
        self._address = (self._address + 1) % len(self.addresses)
        self.home = self.addresses[self._address]
        log.log(
            level, "actor %s: learner at %s gone (%s); failing over to %s",
            self.actor_id, gone, details, self.home,
        )  # fmt: skip

    def stream_frames(
        self, channel: grpc.Channel, spec: pb.EnvSpec, frame_stack: int = 0
    ) -> StreamEnd:
        """One Act stream: Hello, then the lockstep frame/actions loop.

        ``frame_stack`` D > 1 (the learner's offer): send only the newest of the D frames
        each observation stacks, when this actor's observations are such stacks.
        """
        stream = open_stream(channel, ACT_METHOD, self.metadata)
        self._stream = stream
        try:
            if self._stop.is_set():
                return StreamEnd.STOPPED
            return self._stream_frames(stream, spec, frame_stack)
        finally:
            self._stream = None
            stream.close()

    def _stream_frames(self, stream: ActorStream, spec: pb.EnvSpec, frame_stack: int) -> StreamEnd:
        """The actor step loop: send the frame, wait for the actions, step the envs."""
        k, max_frames = self.num_envs, self.config.max_frames
        wire = StepWire(spec, k, frame_stack)
        if not self._handshake(stream, spec, wire.newest_of_stack):
            return self._ended(stream)
        vec_env = self.vec_env
        assert vec_env is not None
        obs_KO, reward_K, terminated_K, truncated_K = self._reset_envs()
        if wire.multi_agent:
            wire.acting = vec_env.acting  # type: ignore[attr-defined]
        clock, record_rtt, stopping = time.perf_counter, self.round_trips.record, self._stop.is_set
        backoff = self.backoff
        while not stopping():
            frame = wire.frame(obs_KO, reward_K, terminated_K, truncated_K)
            sent = clock()
            data = stream.exchange(frame)
            record_rtt(clock() - sent)
            if data is None:
                return self._ended(stream)
            actions_KA = wire.actions(data)
            if isinstance(actions_KA, pb.Shutdown):
                stream.done_writing()
                return StreamEnd.FINISHED if actions_KA.final else StreamEnd.LEARNER_STOPPING
            obs_KO, reward, terminated, truncated, _ = vec_env.step(actions_KA)
            reward_K = np.asarray(reward, dtype=np.float32)
            terminated_K = np.asarray(terminated, dtype=np.bool_)
            truncated_K = np.asarray(truncated, dtype=np.bool_)
            self.frames += k
            if backoff.attempt:  # actions stepped: this learner works, a retry starts short
                backoff.reset()
            if max_frames and self.frames >= max_frames:
                return StreamEnd.MAX_FRAMES
        return StreamEnd.STOPPED

    def _handshake(self, stream: ActorStream, spec: pb.EnvSpec, frame_stack: int) -> bool:
        """Hello (a fresh ``run_id``: the learner gives this stream fresh slots) -> Accept.

        ``frame_stack`` D > 1 tells the learner that frames carry the newest of D only.
        """
        hello = pb.Hello(
            protocol_version=PROTOCOL_VERSION, actor_id=self.actor_id, run_id=uuid.uuid4().hex,
            num_envs=self.num_envs, env=spec, frame_stack=frame_stack,
        )  # fmt: skip
        stream.write(pb.ActorMessage(hello=hello).SerializeToString())
        accept = self._read_reply(stream)
        if accept is None or accept.WhichOneof("kind") != "accept":
            return False
        self.connections += 1
        return True

    def _reset_envs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Fresh episodes for a new connection (the learner's slots are new too): the first
        frame's observations, zero rewards, no episode ends, one row per env (per agent of
        each env for a multi-agent env). Seeded on the first one."""
        assert self.vec_env is not None
        k = self.num_envs
        rows = getattr(self.vec_env, "num_rows", k)
        seed = None if self._seeded else self.config.seed + self.index * k
        self._seeded = True
        obs_KO, _ = self.vec_env.reset(seed=seed)
        return (
            obs_KO, np.zeros(rows, np.float32), np.zeros(rows, np.bool_),
            np.zeros(rows, np.bool_),
        )  # fmt: skip

    @staticmethod
    def _read_reply(stream: ActorStream) -> pb.LearnerMessage | None:
        data = stream.read()
        return None if data is None else parse_reply(data)

    def _ended(self, stream: ActorStream) -> StreamEnd:
        """The learner ended the stream: CLOSED if with OK, else its status as an error."""
        if self._stop.is_set():
            return StreamEnd.STOPPED
        stream.raise_for_status()
        return StreamEnd.CLOSED


def choose_num_envs(config: ActorConfig, info: pb.LearnerInfo, actor_id: str) -> int:
    """K: this actor's own --envs-per-actor, else the learner's advice, else 1 (logged)."""
    if config.envs_per_actor:
        k, source = config.envs_per_actor, "--envs-per-actor"
    elif info.envs_per_actor:
        k, source = info.envs_per_actor, "the learner's advice"
    else:
        k, source = 1, "the default"
    log.info("actor %s: %d envs (%s)", actor_id, k, source)
    return k


def parse_reply(data: bytes) -> pb.LearnerMessage:
    """A LearnerMessage; bytes that do not parse end the stream as an INTERNAL error."""
    try:
        return pb.LearnerMessage.FromString(data)
    except DecodeError:
        message = "unparseable reply from the learner"
        raise StreamError(grpc.StatusCode.INTERNAL, message) from None


def _status_of(exc: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    """Code and details of any gRPC error (ours and grpc's own carry both)."""
    code = getattr(exc, "code", None)
    details = getattr(exc, "details", None)
    return (
        code() if callable(code) else grpc.StatusCode.UNKNOWN,
        (details() if callable(details) else None) or str(exc),
    )
