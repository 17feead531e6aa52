"""A scripted learner: a small ``seedrl.v1.Learner`` server that plays a script against
one actor and records everything the actor does.

It answers GetInfo and Act as a learner would (auth, Hello checks, one Actions reply per
Frame, Shutdown) except where its script says to refuse a call with a status, and it
keeps every call, message and timing for the checks in
:mod:`seedrl.conformance.actor_suite`. Messages travel as raw bytes and are parsed here,
so whatever the actor sent is seen as sent. Like seedrl's learner it ends a stream with
``INVALID_ARGUMENT`` at the first thing wrong, with a message saying what.

A dict/tuple observation (or action) is kept as a numpy record array ``[K]`` with one
field per leaf, named as its leaf (``obs_KO[i]["pos"]``), so every check reads env i's
observation as ``obs_KO[i]`` whatever the space. A multi-agent env (``EnvSpec.agents``)
has K x (its agents) rows in every tensor: "K" below then counts rows, env-major.

Shape suffixes: K envs (rows) in the stream, O observation dims, A action dims, R rows.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from seedrl import PROTOCOL_VERSION, codec
from seedrl.proto import seedrl_pb2 as pb
from seedrl.transport import AUTH_METADATA_KEY, SERVICE_NAME, channel_options

MAX_ENVS = 4096
FRAME_TIMEOUT_S = 20.0
"""How long a stream waits for the actor's next message before giving up on it."""
SHUTDOWN_WAIT_S = 3.0
"""How long a stream stays open after its Shutdown for the actor to end its side (the
rule allows 2 s; the extra second tells "late" from "never")."""
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

MASK_LEAF = "action_mask"
"""The observation leaf that masks the actions (learners' default, --action-mask)."""


def mask_widths(action: pb.SpaceSpec) -> list[int]:
    """The action mask's entries per choice, in mask order: ``[n]`` for a discrete action,
    ``nvec`` (flattened) for a MultiDiscrete one; empty for actions a mask does not cover."""
    if action.kind == "discrete":
        return [int(action.n)]
    if action.kind == "multi_discrete":
        return [int(n) for n in action.nvec]
    return []


HALF_CLOSED = "half-close"
CANCELLED = "cancel"
SILENT = "nothing"


@dataclass(frozen=True)
class Refuse:
    """End the call with this status (an Act stream: once its first message is read)."""

    code: grpc.StatusCode
    details: str = ""


@dataclass(frozen=True)
class Serve:
    """Accept the stream, answer ``frames`` frames with actions, then send a Shutdown in
    place of the next reply."""

    frames: int
    final: bool


@dataclass
class Script:
    """How the scripted learner answers the n-th GetInfo and the n-th Act call."""

    info_refusals: list[grpc.StatusCode | None] = field(default_factory=list)
    """GetInfo call n: refused with this status, or answered (None / past the list)."""
    frame_stack_offers: list[int] = field(default_factory=lambda: [0])
    """LearnerInfo.frame_stack of GetInfo answer n (the last entry repeats)."""
    acts: list[Refuse | Serve] = field(default_factory=list)
    """Act call n (past the list: refused with UNAVAILABLE, the session being over)."""

    def info(self, n: int) -> tuple[grpc.StatusCode | None, int]:
        refusal = self.info_refusals[n] if n < len(self.info_refusals) else None
        return refusal, self.frame_stack_offers[min(n, len(self.frame_stack_offers) - 1)]

    def act(self, n: int) -> Refuse | Serve:
        if n < len(self.acts):
            return self.acts[n]
        return Refuse(grpc.StatusCode.UNAVAILABLE, "conformance: the session is over")


def leaf_record(leaves: list[codec.Leaf]) -> np.dtype:
    """The record dtype of a dict/tuple space's values: one field per leaf, in leaf order."""
    return np.dtype([(leaf.name, leaf.dtype, leaf.shape) for leaf in leaves])


@dataclass
class InfoCall:
    index: int
    at: float
    metadata: dict[str, str]
    refused: grpc.StatusCode | None = None
    info: pb.LearnerInfo | None = None


@dataclass
class FrameRecord:
    at: float
    obs_KO: np.ndarray
    """Whole observations (a stream of newest frames has its stacks rebuilt)."""
    reward_K: np.ndarray
    terminated_K: np.ndarray
    truncated_K: np.ndarray
    actions_KA: np.ndarray | None = None
    """The reply; None for the frame answered with the Shutdown."""
    acting_R: np.ndarray | None = None
    """A multi-agent env's acting rows; None for a single-agent env."""


@dataclass
class StreamRecord:
    index: int
    opened: float
    metadata: dict[str, str]
    info: pb.LearnerInfo | None
    """The last LearnerInfo answered before this stream opened."""
    first: str | None = None
    """What the first message was: hello, frame, empty, undecodable; None if there was none."""
    hello: pb.Hello | None = None
    frames: list[FrameRecord] = field(default_factory=list)
    problems: dict[str, list[str]] = field(default_factory=dict)
    """Case id -> what this stream did wrong against it."""
    refused: grpc.StatusCode | None = None
    """The status the script ended this stream with, if it did."""
    shutdown: pb.Shutdown | None = None
    shutdown_at: float | None = None
    last_message_at: float | None = None
    """When the reader last got a message from the actor."""
    actor_end: str | None = None
    """How the actor's side ended (half-close or cancel), as the reader saw it."""
    actor_end_at: float | None = None
    ended: float | None = None

    def problem(self, case_id: str, text: str) -> None:
        self.problems.setdefault(case_id, []).append(f"stream {self.index}: {text}")

    def after_shutdown(self) -> tuple[str, float | None]:
        """What the actor did after the Shutdown (half-close, cancel, a message, nothing)
        and how many seconds later.

        Read from the reader's record rather than by the serving generator, because an
        actor that cancels at once can end the call before grpc resumes that generator.
        """
        assert self.shutdown_at is not None
        if self.last_message_at is not None and self.last_message_at > self.shutdown_at:
            return "a message", self.last_message_at - self.shutdown_at
        if self.actor_end is not None and self.actor_end_at is not None:
            seconds = self.actor_end_at - self.shutdown_at
            if seconds < SHUTDOWN_WAIT_S:  # later, it was the learner that ended the call
                return self.actor_end, seconds
        return SILENT, None


Chooser = Callable[[int, np.ndarray, np.random.Generator], Any]
"""(env index, its whole observation, rng) -> the action the suite sends that env."""


class ScriptedLearner:
    """The server, its script and its records; ``start`` / ``stop`` it around one actor run."""

    def __init__(
        self,
        env: pb.EnvSpec,
        script: Script,
        token: str | None,
        choose: Chooser | None = None,
        seed: int = 0,
    ) -> None:
        self.env = env
        self.script = script
        self.token = token
        self._choose = choose
        self._rng = np.random.default_rng(seed)
        self.learner_run_id = f"conformance-{seed}"
        self.events: list[InfoCall | StreamRecord] = []
        """Every GetInfo call and Act stream, in the order they arrived."""
        self.changed = threading.Condition()
        """Notified whenever something is recorded (tests of the session wait on it)."""
        self._lock = threading.Lock()
        self._obs_shape = codec.spec_shape(env.observation_space)
        self._obs_leaves: list[codec.Leaf] = []
        """The leaves of a dict/tuple observation space (empty for a leaf space)."""
        if codec.is_structured(env.observation_space):
            self._obs_leaves = codec.space_leaves(env.observation_space)
            self._obs_dtype = leaf_record(self._obs_leaves)
        else:
            self._obs_dtype = np.dtype(env.observation_space.dtype)
        act = env.action_space
        self._act_leaves = codec.space_leaves(act, action=True)
        self._act_structured = codec.is_structured(act)
        self._act_shape: tuple[int, ...] = ()
        if self._act_structured:
            self._act_dtype = leaf_record(self._act_leaves)
        else:
            self._act_dtype, self._act_shape = self._act_leaves[0].dtype, codec.spec_shape(act)
        self._server: grpc.Server | None = None
        self.agents = codec.rows_per_env(env) if env.agents else 0
        """A multi-agent env's agents per env (rows of every frame); 0 for one agent."""
        self._mask_widths = mask_widths(act)
        self._mask = next(
            (
                leaf.name for leaf in self._obs_leaves
                if leaf.name == MASK_LEAF and self._mask_widths
                and int(np.prod(leaf.shape)) == sum(self._mask_widths)
            ),
            "",
        )  # fmt: skip
        """The observation leaf that masks a discrete or MultiDiscrete action (random actions
        respect it)."""

    # ------------------------------------------------------------------ records

    @property
    def info_calls(self) -> list[InfoCall]:
        return [e for e in self.events if isinstance(e, InfoCall)]

    @property
    def streams(self) -> list[StreamRecord]:
        return [e for e in self.events if isinstance(e, StreamRecord)]

    def _record(self, event: InfoCall | StreamRecord) -> None:
        with self._lock:
            self.events.append(event)
        self._notify()

    def _notify(self) -> None:
        with self.changed:
            self.changed.notify_all()

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Block until ``predicate()`` holds (re-checked on every record) or ``timeout``."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while not predicate():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self.changed.wait(min(remaining, 0.2))
        return True

    # ------------------------------------------------------------------ server

    def start(self, address: str) -> int:
        """Listen on ``address`` (``host:0`` picks a free port) and serve; returns the port."""
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="scripted-learner"),
            options=[*channel_options(MAX_MESSAGE_BYTES), ("grpc.so_reuseport", 0)],
        )
        handlers = {
            "GetInfo": grpc.unary_unary_rpc_method_handler(self._get_info),
            "Act": grpc.stream_stream_rpc_method_handler(self._act),
        }
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),)
        )
        try:
            port = server.add_insecure_port(address)
        except RuntimeError:  # newer grpcio raises where older ones returned 0
            port = 0
        if port == 0:
            raise OSError(f"the scripted learner could not bind {address}")
        server.start()
        self._server = server
        return port

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=0.5).wait(5)
            self._server = None

    def _authorized(self, metadata: dict[str, str], context: grpc.ServicerContext) -> None:
        if self.token and metadata.get(AUTH_METADATA_KEY) != f"Bearer {self.token}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong auth token")

    def info_message(self, frame_stack: int) -> pb.LearnerInfo:
        return pb.LearnerInfo(
            protocol_version=PROTOCOL_VERSION,
            env=self.env,
            learner_run_id=self.learner_run_id,
            max_message_bytes=MAX_MESSAGE_BYTES,
            frame_stack=frame_stack,
        )

    def _get_info(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        metadata = _metadata(context)
        with self._lock:
            n = len(self.info_calls)
        call = InfoCall(n, time.monotonic(), metadata)
        refusal, offer = self.script.info(n)
        if self.token and metadata.get(AUTH_METADATA_KEY) != f"Bearer {self.token}":
            refusal = grpc.StatusCode.UNAUTHENTICATED
        if refusal is None:
            call.info = self.info_message(offer)
        else:
            call.refused = refusal
        self._record(call)
        if refusal is not None:
            context.abort(refusal, f"conformance: scripted {refusal.name}")
        assert call.info is not None
        return call.info.SerializeToString()

    # ------------------------------------------------------------------ Act

    def _act(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        metadata = _metadata(context)
        with self._lock:
            n = len(self.streams)
            answered = [c for c in self.info_calls if c.info is not None]
        stream = StreamRecord(
            n, time.monotonic(), metadata, answered[-1].info if answered else None
        )
        self._record(stream)
        try:
            self._authorized(metadata, context)
            plan = self.script.act(n)
            reader = _Reader(requests, stream)
            first = reader.get(FRAME_TIMEOUT_S)
            hello = self._read_hello(stream, first, context)
            if isinstance(plan, Refuse):
                stream.refused = plan.code
                context.abort(plan.code, plan.details or f"conformance: scripted {plan.code.name}")
            assert isinstance(plan, Serve)
            accept = pb.LearnerMessage(accept=pb.Accept(learner_run_id=self.learner_run_id))
            yield accept.SerializeToString()
            yield from self._serve(stream, hello, plan, reader, context)
        finally:
            stream.ended = time.monotonic()
            self._notify()

    def _read_hello(
        self, stream: StreamRecord, raw: object, context: grpc.ServicerContext
    ) -> pb.Hello:
        """Parse and check the first message; refuse the stream as a learner would."""
        if not isinstance(raw, bytes):
            stream.first = None
            stream.problem("hello-first", f"the actor sent no message ({raw})")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message must be a Hello")
        assert isinstance(raw, bytes)  # abort raised otherwise
        message = _parse(raw)
        if message is None:
            stream.first = "undecodable"
            stream.problem("hello-first", "the first message does not parse as an ActorMessage")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message does not parse")
        assert message is not None
        stream.first = message.WhichOneof("kind") or "empty"
        if stream.first != "hello":
            stream.problem("hello-first", f"the first message is {stream.first!r}, not a Hello")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message must be a Hello")
        hello = message.hello
        stream.hello = hello
        self._notify()
        problems = self._check_hello(stream, hello)
        if problems:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "; ".join(problems))
        return hello

    def _check_hello(self, stream: StreamRecord, hello: pb.Hello) -> list[str]:
        found: list[str] = []

        def bad(case_id: str, text: str) -> None:
            stream.problem(case_id, text)
            found.append(text)

        if hello.protocol_version != PROTOCOL_VERSION:
            bad(
                "hello-fields", f"protocol_version {hello.protocol_version}, not {PROTOCOL_VERSION}"
            )
        if not hello.actor_id:
            bad("hello-fields", "actor_id is empty")
        if not 1 <= hello.num_envs <= MAX_ENVS:
            bad("hello-fields", f"num_envs {hello.num_envs} is not in [1, {MAX_ENVS}]")
        if not hello.run_id:
            bad("fresh-run-id", "run_id is empty")
        offered = stream.info.frame_stack if stream.info is not None else 0
        if hello.frame_stack not in (0, 1) and hello.frame_stack != offered:
            case = "frame-stack-offered" if offered > 1 else "frame-stack-not-offered"
            bad(case, f"Hello.frame_stack {hello.frame_stack} but GetInfo offered {offered}")
        for text in env_differences(hello.env, self.env):
            bad("hello-env", text)
            if text.startswith("agents"):
                stream.problem("agent-rows", text)
        return found

    def _serve(
        self,
        stream: StreamRecord,
        hello: pb.Hello,
        plan: Serve,
        reader: _Reader,
        context: grpc.ServicerContext,
    ) -> Iterator[bytes]:
        k = hello.num_envs * max(1, self.agents)
        offered = stream.info.frame_stack if stream.info is not None else 0
        newest_only = hello.frame_stack > 1 and hello.frame_stack == offered
        sent_shape = (k, *(self._obs_shape[1:] if newest_only else self._obs_shape))
        for n in range(plan.frames + 1):
            raw = reader.get(FRAME_TIMEOUT_S)
            if not isinstance(raw, bytes):
                stream.problem("tensor-layout", f"the actor stopped after {n} frames ({raw})")
                return
            frame = self._read_frame(stream, n, raw, k, sent_shape, context)
            if newest_only:
                frame.obs_KO = self._restack(stream, frame.obs_KO)
            stream.frames.append(frame)
            self._notify()
            if n == plan.frames:
                break
            frame.actions_KA = self._actions(frame.obs_KO, k)
            yield self._reply(frame.actions_KA)
        shutdown = pb.Shutdown(reason="conformance: scripted shutdown", final=plan.final)
        stream.shutdown = shutdown
        stream.shutdown_at = time.monotonic()
        yield pb.LearnerMessage(shutdown=shutdown).SerializeToString()
        reader.get(SHUTDOWN_WAIT_S)  # keep the call open while the actor ends its side

    def _reply(self, actions_KA: np.ndarray) -> bytes:
        if not self._act_structured:
            reply = pb.Actions(actions=codec.encode_tensor(actions_KA))
        else:  # one tensor per leaf, in leaf order
            reply = pb.Actions(
                action_leaves=[
                    codec.encode_tensor(np.ascontiguousarray(actions_KA[leaf.name]))
                    for leaf in self._act_leaves
                ]
            )
        return pb.LearnerMessage(actions=reply).SerializeToString()

    def _read_frame(
        self,
        stream: StreamRecord,
        n: int,
        raw: bytes,
        k: int,
        sent_shape: tuple[int, ...],
        context: grpc.ServicerContext,
    ) -> FrameRecord:
        """Decode frame ``n`` against the stream's layout, or end the stream saying why."""
        message = _parse(raw)
        where = f"message {n + 1} after the Hello"
        if message is None or message.WhichOneof("kind") != "frame":
            kind = "does not parse" if message is None else f"is {message.WhichOneof('kind')!r}"
            is_hello = message is not None and message.WhichOneof("kind") == "hello"
            case = "hello-first" if is_hello else "tensor-layout"
            stream.problem(case, f"{where} {kind}, not a Frame")
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "only Frame messages may follow the Hello"
            )
        assert message is not None
        f = message.frame
        arrays: list[np.ndarray] = []
        expected: list[tuple[str, pb.Tensor, Any, tuple[int, ...]]] = [
            ("rewards", f.rewards, np.float32, (k,)),
            ("terminated", f.terminated, np.bool_, (k,)),
            ("truncated", f.truncated, np.bool_, (k,)),
        ]
        if not self._obs_leaves:
            expected.insert(0, ("observations", f.observations, self._obs_dtype, sent_shape))
        unit = "rows" if self.agents else "envs"
        for name, tensor, dtype, shape in expected:
            if not f.HasField(name):
                stream.problem("tensor-layout", f"frame {n}: {name} is missing")
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad frame: {name} is missing")
            if tensor.shape and tensor.shape[0] != k:
                stream.problem(
                    "agent-rows" if self.agents else "k-constant",
                    f"frame {n}: {name} carry {tensor.shape[0]} {unit} but the Hello said "
                    + (f"K={k // self.agents} envs of {self.agents} agents" if self.agents
                       else f"K={k}"),
                )  # fmt: skip
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, f"bad frame: K changed to {tensor.shape[0]}"
                )
            try:
                arrays.append(codec.decode_tensor(tensor, name, dtype, shape))
            except codec.WireError as exc:
                stream.problem("tensor-layout", f"frame {n}: {exc}")
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad frame: {exc}")
        if self._obs_leaves:
            arrays.insert(0, self._read_leaves(stream, n, f, k, context))
        acting = self._read_acting(stream, n, f, k, context)
        obs, reward, terminated, truncated = arrays
        values = [obs[x.name] for x in self._obs_leaves] if self._obs_leaves else [obs]
        for name, array in [*(("observations", v) for v in values), ("rewards", reward)]:
            if not codec.all_finite(array):
                stream.problem("finite-values", f"frame {n}: {name} hold NaN or inf")
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad frame: {name}: NaN or inf")
        return FrameRecord(time.monotonic(), obs, reward, terminated, truncated, acting_R=acting)

    def _read_acting(
        self, stream: StreamRecord, n: int, f: pb.Frame, rows: int, context: grpc.ServicerContext
    ) -> np.ndarray | None:
        """A multi-agent env's acting flags ``[rows]``; a single-agent env's frame has none."""
        if not self.agents:
            if f.HasField("acting"):
                stream.problem("tensor-layout", f"frame {n}: acting is set, but the env has "
                               "one agent (acting is for multi-agent envs)")  # fmt: skip
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad frame: acting is set")
            return None
        if not f.HasField("acting"):
            stream.problem("agent-rows", f"frame {n}: acting is missing (a multi-agent env's "
                           f"frame carries bool [{rows}])")  # fmt: skip
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad frame: acting is missing")
        try:
            return codec.decode_tensor(f.acting, "acting", np.bool_, (rows,))
        except codec.WireError as exc:
            stream.problem("agent-rows", f"frame {n}: {exc} (K x A = {rows} rows)")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad frame: {exc}")
        raise AssertionError("abort raised")

    def _read_leaves(
        self, stream: StreamRecord, n: int, f: pb.Frame, k: int, context: grpc.ServicerContext
    ) -> np.ndarray:
        """A dict/tuple observation's leaves as one record array ``[K]``, or the stream
        ended with what was wrong (problems of case observation-leaves)."""

        def bad(case_id: str, text: str) -> None:
            stream.problem(case_id, f"frame {n}: {text}")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad frame: {text}")

        if f.HasField("observations"):
            bad("observation-leaves", "observations is set, but a dict/tuple observation "
                "travels in observation_leaves")  # fmt: skip
        if len(f.observation_leaves) != len(self._obs_leaves):
            bad("observation-leaves", f"{len(f.observation_leaves)} observation_leaves, but "
                f"the space has {len(self._obs_leaves)} leaves")  # fmt: skip
        obs = np.zeros(k, self._obs_dtype)
        unit = "rows" if self.agents else "envs"
        for leaf, tensor in zip(self._obs_leaves, f.observation_leaves, strict=True):
            if tensor.shape and tensor.shape[0] != k:
                bad("agent-rows" if self.agents else "k-constant",
                    f"leaf {leaf.name!r} carries {tensor.shape[0]} {unit} but the Hello said "
                    + (f"K={k // self.agents} envs of {self.agents} agents" if self.agents
                       else f"K={k}"))  # fmt: skip
            try:
                obs[leaf.name] = codec.decode_tensor(
                    tensor, f"leaf {leaf.name!r}", leaf.dtype, (k, *leaf.shape)
                )
            except codec.WireError as exc:
                bad("observation-leaves", f"{exc} (leaves in leaf order: "
                    f"{', '.join(x.name for x in self._obs_leaves)})")  # fmt: skip
        return obs

    def _restack(self, stream: StreamRecord, newest_KO: np.ndarray) -> np.ndarray:
        """Whole stacks from newest frames, by seedrl's rule (an episode starts as zeros)."""
        k = newest_KO.shape[0]
        previous = stream.frames[-1] if stream.frames else None
        stacks = np.zeros((k, *self._obs_shape), self._obs_dtype)
        if previous is not None:
            ended = previous.terminated_K | previous.truncated_K
            stacks[~ended, :-1] = previous.obs_KO[~ended, 1:]
        stacks[:, -1] = newest_KO
        return stacks

    def _actions(self, obs_KO: np.ndarray, k: int) -> np.ndarray:
        actions = np.zeros((k, *self._act_shape), self._act_dtype)
        for i in range(k):
            if self._choose is not None:
                actions[i] = self._choose(i, obs_KO[i], self._rng)
            elif self._mask and obs_KO[i][self._mask].any():  # as a learner: never masked
                actions[i] = self._allowed_action(obs_KO[i][self._mask])
            elif self._act_structured:
                for leaf in self._act_leaves:
                    actions[i][leaf.name] = self._random_action(leaf)
            else:
                actions[i] = self._random_action(self._act_leaves[0])
        return actions

    def _allowed_action(self, mask: np.ndarray) -> Any:
        """A random action the mask allows: one allowed entry per choice (a choice whose
        entries are all masked, as on a waiting row, takes any)."""
        entries = np.asarray(mask).reshape(-1) != 0
        start, picks = 0, []
        for width in self._mask_widths:
            allowed = np.flatnonzero(entries[start : start + width])
            picks.append(self._rng.choice(allowed) if len(allowed) else self._rng.integers(width))
            start += width
        return picks[0] if len(picks) == 1 else np.reshape(picks, self._act_shape)

    def _random_action(self, leaf: codec.Leaf) -> Any:
        """A valid action of one leaf: a Box's within its finite bounds, normal elsewhere."""
        spec = leaf.spec
        if spec.kind == "discrete":
            return self._rng.integers(int(spec.n))
        if spec.kind == "multi_discrete":
            return self._rng.integers(np.asarray(spec.nvec).reshape(leaf.shape))
        if spec.kind == "multi_binary":
            return self._rng.integers(0, 2, leaf.shape)
        sample = self._rng.normal(size=leaf.shape).astype(np.float32)
        low, high = codec.action_bounds(spec)
        if low is None or high is None:
            return sample
        low, high = low.reshape(leaf.shape), high.reshape(leaf.shape)
        finite = np.isfinite(low) & np.isfinite(high)
        uniform = self._rng.uniform(np.where(finite, low, 0), np.where(finite, high, 1))
        return np.where(finite, uniform, sample).astype(np.float32)


class _Reader:
    """The actor's messages on a thread of their own, so every wait for one is bounded."""

    def __init__(self, requests: Iterator[bytes], stream: StreamRecord) -> None:
        self._queue: queue.SimpleQueue[bytes | str] = queue.SimpleQueue()
        self._requests = requests
        self._stream = stream
        threading.Thread(target=self._run, daemon=True, name="scripted-reader").start()

    def _run(self) -> None:
        try:
            for raw in self._requests:
                self._stream.last_message_at = time.monotonic()
                self._queue.put(raw)
            end = HALF_CLOSED
        except Exception:  # the call was cancelled (grpc raises its RpcError) or torn down
            end = CANCELLED
        self._stream.actor_end, self._stream.actor_end_at = end, time.monotonic()
        self._queue.put(end)

    def get(self, timeout: float) -> bytes | str:
        """The next message, or what ended the stream, or ``nothing`` after ``timeout``."""
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return SILENT


def _parse(raw: bytes) -> pb.ActorMessage | None:
    try:
        return pb.ActorMessage.FromString(raw)
    except DecodeError:
        return None


def _metadata(context: grpc.ServicerContext) -> dict[str, str]:
    found: dict[str, str] = {}
    for key, value in context.invocation_metadata() or ():
        found[key] = value if isinstance(value, str) else value.decode(errors="replace")
    return found


def env_differences(theirs: pb.EnvSpec, ours: pb.EnvSpec) -> list[str]:
    """What differs between an actor's EnvSpec and the learner's, one line each."""
    found: list[str] = []
    if theirs.env_id != ours.env_id:
        found.append(f"env_id {theirs.env_id!r}, but GetInfo said {ours.env_id!r}")
    try:
        same_kwargs = json.loads(theirs.env_kwargs_json or "{}") == json.loads(
            ours.env_kwargs_json or "{}"
        )
    except json.JSONDecodeError:
        same_kwargs = False
    if not same_kwargs:
        found.append(
            f"env_kwargs_json {theirs.env_kwargs_json!r}, but GetInfo said {ours.env_kwargs_json!r}"
        )
    if list(theirs.agents) != list(ours.agents):
        found.append(f"agents {list(theirs.agents)}, but GetInfo said {list(ours.agents)}")
    for name in ("observation_space", "action_space"):
        a, b = getattr(theirs, name), getattr(ours, name)
        if not codec.specs_match(a, b):
            found.append(
                f"{name} {codec.spec_summary(a)}, but GetInfo said {codec.spec_summary(b)}"
            )
            continue
        for bound in ("low", "high"):
            mine, learners = getattr(a, bound), getattr(b, bound)
            if mine.ByteSize() and learners.ByteSize() and not _same_tensor(mine, learners):
                found.append(f"{name}.{bound} differs from GetInfo's")
    return found


def _same_tensor(a: pb.Tensor, b: pb.Tensor) -> bool:
    try:
        x = codec.decode_tensor(a, "bound")
        y = codec.decode_tensor(b, "bound")
    except codec.WireError:
        return False
    return x.shape == y.shape and bool(np.array_equal(x.astype(np.float64), y.astype(np.float64)))
