"""The learner side of the conformance suite: a scripted actor against a learner address.

It asks GetInfo, then opens its own streams: well-behaved ones that step a few frames of
valid observations (with episode ends), and bad ones that must be refused with the
documented status, while one good stream keeps stepping between them to show that a bad
stream ends alone. Nothing here depends on how the learner is built: only the wire.

Shape suffixes: K envs in a stream, O observation dims.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, cast

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from seedrl import PROTOCOL_VERSION, codec
from seedrl.conformance.cases import Case, Report, Skip, Status, Verdict, select
from seedrl.conformance.config import LearnerSuiteConfig
from seedrl.conformance.scripted import MASK_LEAF, mask_widths
from seedrl.proto import seedrl_pb2 as pb
from seedrl.security import resolve_auth_token
from seedrl.transport import ACT_METHOD, auth_metadata, client_channel

INVALID = grpc.StatusCode.INVALID_ARGUMENT
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
HEALTH_SERVING = b"\x08\x01"
"""``HealthCheckResponse{status: SERVING}`` on the wire (field 1, varint 1)."""
MAX_ENVS = 4096
OVERSIZE_LIMIT = 256 * 1024 * 1024
"""oversized-message is skipped for learners whose max_message_bytes is above this."""


@dataclass
class Ended:
    """How a stream ended, from the client's side."""

    code: grpc.StatusCode
    details: str


class ScriptedStream:
    """One Act stream in lockstep, with every wait bounded; messages as raw bytes."""

    def __init__(
        self,
        channel: grpc.Channel,
        metadata: tuple[tuple[str, str], ...],
        timeout: float,
        lifetime: float,
    ) -> None:
        self._requests: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._replies: queue.SimpleQueue[bytes | Ended] = queue.SimpleQueue()
        self._timeout = timeout
        self._call: Any = channel.stream_stream(ACT_METHOD)(
            iter(self._requests.get, None), metadata=metadata, timeout=lifetime
        )
        threading.Thread(target=self._read, daemon=True, name="scripted-actor").start()
        self.ended: Ended | None = None

    def _read(self) -> None:
        try:
            for raw in self._call:
                self._replies.put(raw)
            self._replies.put(Ended(grpc.StatusCode.OK, ""))
        except grpc.RpcError as exc:
            self._replies.put(Ended(exc.code(), exc.details() or ""))

    def send(self, message: pb.ActorMessage | bytes) -> None:
        self._requests.put(message if isinstance(message, bytes) else message.SerializeToString())

    def receive(self) -> pb.LearnerMessage | Ended:
        """The next reply, or how the stream ended (a timeout reads as DEADLINE_EXCEEDED)."""
        if self.ended is not None:
            return self.ended
        try:
            item = self._replies.get(timeout=self._timeout)
        except queue.Empty:
            self.cancel()
            self.ended = Ended(
                grpc.StatusCode.DEADLINE_EXCEEDED, f"no reply within {self._timeout:g} s"
            )
            return self.ended
        if isinstance(item, Ended):
            self.ended = item
            return item
        try:
            return pb.LearnerMessage.FromString(item)
        except DecodeError:
            self.cancel()
            self.ended = Ended(grpc.StatusCode.INTERNAL, "the learner sent bytes that do not parse")
            return self.ended

    def exchange(self, message: pb.ActorMessage | bytes) -> pb.LearnerMessage | Ended:
        self.send(message)
        return self.receive()

    def half_close(self) -> Ended:
        """End our side and wait for the learner to end the stream."""
        self._requests.put(None)
        while True:
            reply = self.receive()
            if isinstance(reply, Ended):
                return reply

    def cancel(self) -> None:
        self._call.cancel()
        self._requests.put(None)


@dataclass
class _GoodRun:
    accept: str = ""
    actions: list[str] = field(default_factory=list)
    ends: list[str] = field(default_factory=list)
    reconnect: list[str] = field(default_factory=list)


@dataclass
class LearnerContext:
    channel: grpc.Channel
    config: LearnerSuiteConfig
    token: str | None
    info: pb.LearnerInfo | None = None
    info_error: str = ""
    good: ScriptedStream | None = None
    """The stream that keeps stepping between the bad ones (bad-stream-isolated)."""
    good_problems: list[str] = field(default_factory=list)
    bad_streams: int = 0
    good_run: _GoodRun | None = None
    """What the well-behaved streams showed (run once, read by four cases)."""

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return auth_metadata(self.token)

    def stream(self, metadata: tuple[tuple[str, str], ...] | None = None) -> ScriptedStream:
        md = self.metadata if metadata is None else metadata
        c = self.config
        lifetime = max(20 * c.call_timeout_s, c.wait_shutdown_s + 2 * c.call_timeout_s)
        return ScriptedStream(self.channel, md, c.call_timeout_s, lifetime)

    def need_info(self) -> pb.LearnerInfo:
        if self.info is None:
            raise Skip(f"no LearnerInfo to work from ({self.info_error})")
        return self.info


# ---------------------------------------------------------------------- messages


def hello(info: pb.LearnerInfo, k: int, **changes: Any) -> pb.ActorMessage:
    fields: dict[str, Any] = {
        "protocol_version": PROTOCOL_VERSION,
        "actor_id": "seedrl-conformance",
        "run_id": uuid.uuid4().hex,
        "num_envs": k,
        "env": info.env,
    }
    fields.update(changes)
    return pb.ActorMessage(hello=pb.Hello(**fields))


Observation = np.ndarray | list[np.ndarray]
"""K envs' observations: one array for a leaf space, one per leaf for a dict/tuple space."""


def rows(info: pb.LearnerInfo, k: int) -> int:
    """The rows of every tensor of a stream of K envs: K x A for a multi-agent env."""
    return k * codec.rows_per_env(info.env)


def valid_obs(space: pb.SpaceSpec, k: int, newest_only: bool = False) -> Observation:
    """K observations (rows) inside the space (zeros, moved into the bounds where they
    exclude 0; an action mask allowing everything); a dict/tuple space's as one array per
    leaf."""
    if codec.is_structured(space):
        return [
            np.ones((k, *leaf.shape), leaf.dtype) if leaf.name == MASK_LEAF
            else cast(np.ndarray, valid_obs(leaf.spec, k))
            for leaf in codec.space_leaves(space)
        ]  # fmt: skip
    obs = np.zeros(codec.spec_shape(space), np.float64)
    if space.low.data and space.high.data:
        low = codec.decode_tensor(space.low, "low").astype(np.float64)
        high = codec.decode_tensor(space.high, "high").astype(np.float64)
        obs = np.clip(obs, low, high)
    one = (obs[-1] if newest_only else obs).astype(space.dtype)
    return np.broadcast_to(one, (k, *one.shape)).copy()


def frame(
    info: pb.LearnerInfo,
    obs: Observation,
    reward: np.ndarray | None = None,
    terminated: np.ndarray | None = None,
    truncated: np.ndarray | None = None,
    acting: np.ndarray | bool | None = None,
) -> pb.ActorMessage:
    """A Frame of these rows; ``acting`` None: every row acting for a multi-agent env and
    the field unset for a single-agent one; False: unset; an array: sent as is."""
    k = len(obs[0]) if isinstance(obs, list) else obs.shape[0]
    message = pb.ActorMessage()
    f = message.frame
    no = np.zeros(k, np.bool_)
    if isinstance(obs, list):
        f.observation_leaves.extend(codec.encode_tensor(leaf) for leaf in obs)
    else:
        codec.encode_tensor(obs, f.observations)
    codec.encode_tensor(np.zeros(k, np.float32) if reward is None else reward, f.rewards)
    codec.encode_tensor(no if terminated is None else terminated, f.terminated)
    codec.encode_tensor(no if truncated is None else truncated, f.truncated)
    if acting is None and info.env.agents:
        acting = np.ones(k, np.bool_)
    if isinstance(acting, np.ndarray):
        codec.encode_tensor(acting, f.acting)
    return message


def actions_problem(
    reply: pb.LearnerMessage | Ended,
    info: pb.LearnerInfo,
    k: int,
    allowed: np.ndarray | None = None,
) -> str:
    """What is wrong with a reply that should carry K envs' actions, a row each ("" if
    nothing); ``allowed`` (rows x mask entries, a discrete or MultiDiscrete action space)
    marks the actions the acting rows' masks allow."""
    k = rows(info, k)
    if isinstance(reply, Ended):
        return f"the stream ended with {reply.code.name}: {reply.details}"
    kind = reply.WhichOneof("kind")
    if kind != "actions":
        return f"the reply is {kind!r}, not Actions"
    space = info.env.action_space
    leaves = codec.space_leaves(space, action=True)
    got = reply.actions
    if codec.is_structured(space):
        if got.HasField("actions"):
            return "actions is set, but a dict/tuple action travels in action_leaves"
        if len(got.action_leaves) != len(leaves):
            return f"{len(got.action_leaves)} action_leaves, but the space has {len(leaves)}"
        tensors = list(got.action_leaves)
    else:
        if got.action_leaves:
            return "action_leaves are set, but a leaf action space travels in actions"
        tensors = [got.actions]
    for leaf, tensor in zip(leaves, tensors, strict=True):
        name = f"action leaf {leaf.name!r}" if leaf.name else "actions"
        try:
            actions = codec.decode_tensor(tensor, name, leaf.dtype, (k, *leaf.shape))
        except codec.WireError as exc:
            return str(exc)
        problem = _action_values_problem(leaf, actions)
        if problem:
            return f"{name}: {problem}"
        problem = "" if allowed is None else _masked_problem(leaf, actions, allowed)
        if problem:
            return f"{name}: {problem}"
    return ""


def _masked_problem(leaf: codec.Leaf, actions: np.ndarray, allowed: np.ndarray) -> str:
    """What is masked in the acting rows' actions (rows whose mask allows something): the
    action, or for a MultiDiscrete action each element, must be one its mask allows."""
    widths = mask_widths(leaf.spec)
    starts = np.cumsum([0, *widths[:-1]])
    actions_RE = actions.reshape(len(actions), -1).astype(np.int64)
    ok_RE = np.take_along_axis(allowed, starts + actions_RE, axis=1)
    masked = [r for r in range(len(actions)) if allowed[r].any() and not ok_RE[r].all()]
    if not masked:
        return ""
    problem = f"rows {masked} got masked actions {[actions[r].tolist() for r in masked]}"
    if len(widths) > 1:  # name the element, since a mask per element is easy to misplace
        r = masked[0]
        e = int(np.flatnonzero(~ok_RE[r])[0])
        problem += (f" (row {r}'s element {e} is {actions_RE[r, e]}, which mask entry "
                    f"{starts[e] + actions_RE[r, e]} forbids)")  # fmt: skip
    return problem


def _action_values_problem(leaf: codec.Leaf, actions: np.ndarray) -> str:
    """What is outside the leaf's space in K actions ("" if nothing)."""
    spec = leaf.spec
    if spec.kind == "discrete" and not ((actions >= 0) & (actions < spec.n)).all():
        return f"{actions.tolist()} are outside [0, {spec.n})"
    if spec.kind == "multi_discrete":
        nvec = np.asarray(spec.nvec).reshape(leaf.shape)
        if not ((actions >= 0) & (actions < nvec)).all():
            return f"{actions.tolist()} are outside [0, nvec {nvec.tolist()})"
    if spec.kind == "multi_binary" and not np.isin(actions, (0, 1)).all():
        return f"{actions.tolist()} are not all 0 or 1"
    if spec.kind == "box" and not np.isfinite(actions).all():
        return "hold NaN or inf"
    return ""


# ---------------------------------------------------------------------- checks

Check = Callable[[LearnerContext], list[str]]
CHECKS: dict[str, Check] = {}


def check(case_id: str) -> Callable[[Check], Check]:
    def register(fn: Check) -> Check:
        CHECKS[case_id] = fn
        return fn

    return register


SPACE_CHECKS: dict[str, Callable[[pb.SpaceSpec, str], list[str]]] = {}
"""Space kind -> the checks of its SpaceSpec (a new kind on the wire adds an entry)."""


def _discrete_problems(space: pb.SpaceSpec, name: str) -> list[str]:
    problems = []
    if space.n < 1:
        problems.append(f"{name}: a discrete space needs n >= 1, got {space.n}")
    if list(space.shape) or space.dtype != "int64":
        problems.append(f"{name}: a discrete space has shape [] and dtype int64")
    return problems


def _box_problems(space: pb.SpaceSpec, name: str) -> list[str]:
    problems = []
    if space.dtype not in codec.ALLOWED_DTYPES:
        problems.append(f"{name}: dtype {space.dtype!r} is not a wire dtype")
    if any(d < 0 for d in space.shape) or len(space.shape) > codec.MAX_RANK:
        problems.append(f"{name}: shape {list(space.shape)} is not a valid shape")
    for bound in ("low", "high"):
        tensor = getattr(space, bound)
        if not tensor.ByteSize():
            continue
        try:
            value = codec.decode_tensor(tensor, f"{name}.{bound}")
        except codec.WireError as exc:
            problems.append(str(exc))
            continue
        if value.shape != tuple(space.shape):
            problems.append(
                f"{name}.{bound}: shape {list(value.shape)}, not the space's {list(space.shape)}"
            )
    return problems


def _multi_discrete_problems(space: pb.SpaceSpec, name: str) -> list[str]:
    problems = _box_problems(space, name)
    if len(space.nvec) != int(np.prod(list(space.shape))) or min(space.nvec, default=0) < 1:
        problems.append(f"{name}: nvec {list(space.nvec)} needs prod(shape) entries of at least 1")
    return problems


def _container_problems(space: pb.SpaceSpec, name: str) -> list[str]:
    problems = []
    if not space.children:
        problems.append(f"{name}: a {space.kind} space needs at least one child")
    keys = [child.name for child in space.children]
    if space.kind == "dict" and (
        not all(keys) or len(set(keys)) != len(keys) or any("." in x for x in keys)
    ):
        problems.append(f"{name}: dict keys {keys} must be non-empty, unique and without '.'")
    for index, child in enumerate(space.children):
        where = f"{name}.{child.name if space.kind == 'dict' else index}"
        kind_check = SPACE_CHECKS.get(child.kind)
        if kind_check is None:
            problems.append(f"{where}: kind {child.kind!r} is not one of {sorted(SPACE_CHECKS)}")
        else:
            problems += kind_check(child, where)
    return problems


SPACE_CHECKS.update(
    discrete=_discrete_problems,
    box=_box_problems,
    multi_discrete=_multi_discrete_problems,
    multi_binary=_box_problems,
    dict=_container_problems,
    tuple=_container_problems,
)


@check("info-valid")
def _info_valid(ctx: LearnerContext) -> list[str]:
    if ctx.info is None:
        return [f"GetInfo failed: {ctx.info_error}"]
    info = ctx.info
    problems = []
    if info.protocol_version != PROTOCOL_VERSION:
        problems.append(f"protocol_version {info.protocol_version}, not {PROTOCOL_VERSION}")
    if not info.env.env_id:
        problems.append("env.env_id is empty")
    try:
        kwargs = json.loads(info.env.env_kwargs_json or "{}")
        if not isinstance(kwargs, dict):
            problems.append("env.env_kwargs_json is not a JSON object")
    except json.JSONDecodeError:
        problems.append("env.env_kwargs_json is not JSON")
    for name in ("observation_space", "action_space"):
        space = getattr(info.env, name)
        kind_check = SPACE_CHECKS.get(space.kind)
        if kind_check is None:
            problems.append(f"{name}: kind {space.kind!r} is not one of {sorted(SPACE_CHECKS)}")
        else:
            problems += kind_check(space, name)
    agents = list(info.env.agents)
    if len(set(agents)) != len(agents) or not all(agents):
        problems.append(f"env.agents {agents} must be distinct, non-empty ids")
    if not info.learner_run_id:
        problems.append("learner_run_id is empty")
    if info.max_message_bytes <= 0:
        problems.append(f"max_message_bytes {info.max_message_bytes} is not positive")
    d = info.frame_stack
    obs_shape = codec.spec_shape(info.env.observation_space)
    if d == 1 or (d > 1 and (len(obs_shape) < 2 or obs_shape[0] != d)):
        problems.append(f"frame_stack {d} does not fit observations of shape {list(obs_shape)}")
    return problems


@check("health-serving")
def _health_serving(ctx: LearnerContext) -> list[str]:
    try:
        raw = ctx.channel.unary_unary(HEALTH_CHECK)(b"", timeout=ctx.config.call_timeout_s)
    except grpc.RpcError as exc:
        return [f"Health/Check without a token ended with {exc.code().name}: {exc.details()}"]
    if raw != HEALTH_SERVING:
        return [f"Health/Check answered {raw!r}, not SERVING"]
    return []


@check("auth-required")
def _auth_required(ctx: LearnerContext) -> list[str]:
    if not ctx.token:
        raise Skip("no token given (--auth-token or $SEEDRL_AUTH_TOKEN)")
    info = ctx.need_info()
    problems = []
    for label, metadata in (("no token", ()), ("a wrong token", auth_metadata("not-" + ctx.token))):
        try:
            ctx.channel.unary_unary("/seedrl.v1.Learner/GetInfo")(
                b"", metadata=metadata, timeout=ctx.config.call_timeout_s
            )
            problems.append(f"GetInfo with {label} was answered")
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAUTHENTICATED:
                problems.append(
                    f"GetInfo with {label} ended with {exc.code().name}, not UNAUTHENTICATED"
                )
        stream = ctx.stream(metadata)
        reply = stream.exchange(hello(info, ctx.config.num_envs))
        stream.cancel()
        if not isinstance(reply, Ended):
            problems.append(f"Act with {label} was answered with {reply.WhichOneof('kind')!r}")
        elif reply.code != grpc.StatusCode.UNAUTHENTICATED:
            problems.append(f"Act with {label} ended with {reply.code.name}, not UNAUTHENTICATED")
    return problems


def _good_run(ctx: LearnerContext) -> _GoodRun:
    """One well-behaved stream with episode ends, then a second one: hello-accepted,
    actions-reply, episode-ends-served and reconnect-served read from it (run once)."""
    if ctx.good_run is not None:
        return ctx.good_run
    info = ctx.need_info()
    k = ctx.config.num_envs
    result = ctx.good_run = _GoodRun()
    stream = ctx.stream()
    reply = stream.exchange(hello(info, k))
    if isinstance(reply, Ended) or reply.WhichOneof("kind") != "accept":
        got = (
            f"{reply.code.name}: {reply.details}"
            if isinstance(reply, Ended)
            else reply.WhichOneof("kind")
        )
        result.accept = f"the Hello was answered with {got}, not an Accept"
        return result
    if reply.accept.learner_run_id != info.learner_run_id:
        result.accept = (
            f"Accept.learner_run_id {reply.accept.learner_run_id!r} is not "
            f"GetInfo's {info.learner_run_id!r}"
        )
    obs = valid_obs(info.env.observation_space, rows(info, k))
    rng = np.random.default_rng(0)
    script = _episode_script(rows(info, k), ctx.config.frames, rng)
    for n, (reward, terminated, truncated) in enumerate(script):
        # a multi-agent env's final rows do not act (and the others all do)
        acting = ~(terminated | truncated) if info.env.agents else False
        problem = actions_problem(
            stream.exchange(frame(info, obs, reward, terminated, truncated, acting)), info, k
        )
        if problem:
            target = (
                result.ends if n > 0 and (terminated.any() or truncated.any()) else result.actions
            )
            target.append(f"frame {n}: {problem}")
            break
    stream.half_close()
    again = ctx.stream()
    reply = again.exchange(hello(info, k))
    if isinstance(reply, Ended) or reply.WhichOneof("kind") != "accept":
        result.reconnect.append("a second stream's Hello was not accepted")
    else:
        for n in range(2):
            problem = actions_problem(again.exchange(frame(info, obs)), info, k)
            if problem:
                result.reconnect.append(f"second stream, frame {n}: {problem}")
                break
    again.half_close()
    return result


def _episode_script(
    k: int, frames: int, rng: np.random.Generator
) -> Iterator[tuple[np.ndarray, ...]]:
    """Rewards and flags of a plausible run: a reset frame, then steps where env 0
    terminates and env K-1 is truncated every few frames, each followed by a reset frame."""
    ended = np.zeros(k, np.bool_)
    for n in range(frames):
        reward = np.where(ended, 0.0, rng.uniform(-1, 1, k)).astype(np.float32)
        terminated = np.zeros(k, np.bool_)
        truncated = np.zeros(k, np.bool_)
        if n == 0:
            reward[:] = 0
        elif not ended.any():
            terminated[0] = n % 5 == 0
            truncated[-1] = n % 7 == 0 and (k > 1 or not terminated[0])
        yield reward, terminated, truncated
        ended = terminated | truncated


@check("hello-accepted")
def _hello_accepted(ctx: LearnerContext) -> list[str]:
    problem = _good_run(ctx).accept
    return [problem] if problem else []


@check("actions-reply")
def _actions_reply(ctx: LearnerContext) -> list[str]:
    run = _good_run(ctx)
    if run.accept and "not an Accept" in run.accept:
        raise Skip(run.accept)
    return run.actions


@check("episode-ends-served")
def _episode_ends_served(ctx: LearnerContext) -> list[str]:
    run = _good_run(ctx)
    if run.accept and "not an Accept" in run.accept:
        raise Skip(run.accept)
    return run.ends


@check("reconnect-served")
def _reconnect_served(ctx: LearnerContext) -> list[str]:
    return _good_run(ctx).reconnect


def _good_step(ctx: LearnerContext) -> None:
    """One round trip of the stream that steps between the bad ones."""
    info = ctx.need_info()
    k = ctx.config.num_envs
    if ctx.good is None:
        ctx.good = ctx.stream()
        reply = ctx.good.exchange(hello(info, k))
        if isinstance(reply, Ended) or reply.WhichOneof("kind") != "accept":
            ctx.good_problems.append("the good stream's Hello was not accepted")
            return
    if ctx.good.ended is not None:
        return
    problem = actions_problem(
        ctx.good.exchange(frame(info, valid_obs(info.env.observation_space, rows(info, k)))),
        info,
        k,
    )
    if problem:
        ctx.good_problems.append(f"after {ctx.bad_streams} bad streams: {problem}")


def _refused(
    ctx: LearnerContext, label: str, messages: list[pb.ActorMessage | bytes], code: grpc.StatusCode
) -> str:
    """Play ``messages`` on a new stream; "" when it ends with ``code`` and a message."""
    _good_step(ctx)
    stream = ctx.stream()
    ended: Ended | None = None
    for message in messages:
        reply = stream.exchange(message)
        if isinstance(reply, Ended):
            ended = reply
            break
    if ended is None:
        ended = stream.half_close()
    stream.cancel()
    ctx.bad_streams += 1
    if ended.code != code:
        return f"{label}: ended with {ended.code.name} ({ended.details!r}), not {code.name}"
    if not ended.details:
        return f"{label}: {code.name} without a message saying what was wrong"
    return ""


def _changed_env(info: pb.LearnerInfo, change: Callable[[pb.EnvSpec], None]) -> pb.EnvSpec:
    env = pb.EnvSpec()
    env.CopyFrom(info.env)
    change(env)
    return env


@check("rejects-bad-hello")
def _rejects_bad_hello(ctx: LearnerContext) -> list[str]:
    info = ctx.need_info()
    k = ctx.config.num_envs
    obs = valid_obs(info.env.observation_space, rows(info, k))
    other_stack = info.frame_stack + 1 if info.frame_stack > 1 else 4

    def grow_obs(env: pb.EnvSpec) -> None:
        env.observation_space.shape.append(2)

    def other_action(env: pb.EnvSpec) -> None:
        if env.action_space.kind == "discrete":
            env.action_space.n += 1
        else:
            env.action_space.shape.append(2)

    cases: list[tuple[str, list[pb.ActorMessage | bytes]]] = [
        ("a Frame first", [frame(info, obs)]),
        ("an empty first message", [pb.ActorMessage()]),
        ("protocol version 2", [hello(info, k, protocol_version=PROTOCOL_VERSION + 1)]),
        ("an empty run_id", [hello(info, k, run_id="")]),
        ("num_envs 0", [hello(info, 0)]),
        (f"num_envs {MAX_ENVS + 1}", [hello(info, MAX_ENVS + 1)]),
        (
            "another env_id",
            [
                hello(
                    info,
                    k,
                    env=_changed_env(info, lambda e: setattr(e, "env_id", e.env_id + "-other")),
                )
            ],
        ),
        ("another observation space", [hello(info, k, env=_changed_env(info, grow_obs))]),
        ("another action space", [hello(info, k, env=_changed_env(info, other_action))]),
        (f"frame_stack {other_stack} not offered", [hello(info, k, frame_stack=other_stack)]),
        ("a second Hello", [hello(info, k), hello(info, k)]),
    ]
    return [p for label, messages in cases if (p := _refused(ctx, label, messages, INVALID))]


@check("rejects-bad-frame")
def _rejects_bad_frame(ctx: LearnerContext) -> list[str]:
    info = ctx.need_info()
    k = ctx.config.num_envs
    space = info.env.observation_space
    n = rows(info, k)
    obs = valid_obs(space, n)
    acting_more = np.ones(n + 1, np.bool_) if info.env.agents else False
    first = obs[0] if isinstance(obs, list) else obs  # a dict/tuple's first leaf stands in
    wrong_dtype = "float64" if first.dtype != np.float64 else "float32"
    short = frame(info, obs)
    tensor = (
        short.frame.observation_leaves[0] if isinstance(obs, list) else short.frame.observations
    )
    tensor.data = tensor.data[:-1]
    widened = np.concatenate([first, first], axis=-1) if first.ndim > 1 else first[:, None]
    cases: list[tuple[str, list[pb.ActorMessage | bytes]]] = [
        (
            "observations of another dtype",
            [frame(info, _with_first(obs, first.astype(wrong_dtype)))],
        ),
        ("observations of another shape", [frame(info, _with_first(obs, widened))]),
        ("observations one byte short", [short]),
        ("float64 rewards", [frame(info, obs, reward=np.zeros(n, np.float64))]),
        ("uint8 terminated flags", [frame(info, obs, terminated=np.zeros(n, np.uint8))]),
        (
            "K changed mid-stream",
            [frame(info, obs), frame(info, valid_obs(space, n + 1), acting=acting_more)],
        ),
        ("an infinite reward", [frame(info, obs, reward=np.full(n, np.inf, np.float32))]),
        ("bytes that do not parse", [b"\xff" * 40]),
    ]
    leaves = obs if isinstance(obs, list) else [obs]
    floating = [i for i, leaf in enumerate(leaves) if leaf.dtype.kind == "f"]
    if floating:
        nan = [np.full_like(leaf, np.nan) if i == floating[0] else leaf
               for i, leaf in enumerate(leaves)]  # fmt: skip
        cases.append(("NaN observations", [frame(info, nan if isinstance(obs, list) else nan[0])]))
    return [
        p for label, messages in cases
        if (p := _refused(ctx, label, [hello(info, k), *messages], INVALID))
    ]  # fmt: skip


def _with_first(obs: Observation, first: np.ndarray) -> Observation:
    """``obs`` with its first leaf (or its one array) replaced."""
    return [first, *obs[1:]] if isinstance(obs, list) else first


@check("rejects-bad-leaves")
def _rejects_bad_leaves(ctx: LearnerContext) -> list[str]:
    info = ctx.need_info()
    space = info.env.observation_space
    if not codec.is_structured(space):
        raise Skip(
            f"{info.env.env_id}'s observation is not a dict/tuple "
            "(try --env seedrl.conformance.probe:DictProbe)"
        )
    k = ctx.config.num_envs
    leaves = valid_obs(space, rows(info, k))
    assert isinstance(leaves, list)
    whole = frame(info, leaves)
    codec.encode_tensor(leaves[0], whole.frame.observations)
    cases: list[tuple[str, list[pb.ActorMessage | bytes]]] = [
        ("observations set beside the leaves", [whole]),
        ("the last leaf missing", [frame(info, leaves[:-1])]),
        ("one leaf too many", [frame(info, [*leaves, leaves[-1]])]),
    ]
    layouts = [(leaf.dtype, leaf.shape) for leaf in leaves]
    unlike = [j for j in range(1, len(leaves)) if layouts[j] != layouts[0]]
    if unlike:
        swapped = list(leaves)
        swapped[0], swapped[unlike[0]] = leaves[unlike[0]], leaves[0]
        cases.append((f"leaves 0 and {unlike[0]} swapped", [frame(info, swapped)]))
    return [
        p for label, messages in cases
        if (p := _refused(ctx, label, [hello(info, k), *messages], INVALID))
    ]  # fmt: skip


def _multi_agent(info: pb.LearnerInfo) -> int:
    if not info.env.agents:
        raise Skip(
            f"{info.env.env_id} is single-agent (serve a multi-agent env, e.g. "
            "--env seedrl.conformance.probe:TurnProbe)"
        )
    return len(info.env.agents)


@check("rejects-missing-agents")
def _rejects_missing_agents(ctx: LearnerContext) -> list[str]:
    info = ctx.need_info()
    _multi_agent(info)
    agents = list(info.env.agents)
    k = ctx.config.num_envs

    def with_agents(ids: list[str]) -> pb.ActorMessage:
        env = pb.EnvSpec()
        env.CopyFrom(info.env)
        env.agents[:] = ids
        return hello(info, k, env=env)

    cases: list[tuple[str, list[pb.ActorMessage | bytes]]] = [
        ("a Hello without agents", [with_agents([])]),
        ("a Hello with one agent more", [with_agents([*agents, agents[-1] + "-extra"])]),
    ]
    if len(agents) > 1:
        cases.append(("a Hello with the agents in reverse order", [with_agents(agents[::-1])]))
    return [p for label, messages in cases if (p := _refused(ctx, label, messages, INVALID))]


@check("rejects-bad-acting")
def _rejects_bad_acting(ctx: LearnerContext) -> list[str]:
    info = ctx.need_info()
    k = ctx.config.num_envs
    n = rows(info, k)
    obs = valid_obs(info.env.observation_space, n)
    if not info.env.agents:
        cases = [
            ("acting set for a single-agent env", frame(info, obs, acting=np.ones(n, np.bool_)))
        ]
    else:
        short = n - 1 if n > 1 else n + 1
        cases = [
            ("a frame without acting", frame(info, obs, acting=False)),
            (
                f"acting of {short} rows, not K x A = {n}",
                frame(info, obs, acting=np.ones(short, np.bool_)),
            ),
            ("uint8 acting", frame(info, obs, acting=np.ones(n, np.uint8))),
        ]
    return [
        p for label, message in cases
        if (p := _refused(ctx, label, [hello(info, k), message], INVALID))
    ]  # fmt: skip


AGENT_EPISODE = 7
"""Frames of one scripted multi-agent episode: its reset frame, turns, a leaver's final row
at frame 3, everyone else's final rows at the last frame."""


def _agent_script(
    info: pb.LearnerInfo, k: int, frames: int, rng: np.random.Generator
) -> Iterator[tuple[pb.ActorMessage, np.ndarray | None]]:
    """Frames of K multi-agent envs played in turns (round robin among the agents still in),
    with one agent per env leaving early (truncated) and the rest ending together
    (terminated), each followed by a reset frame; and the actions the acting rows' masks
    allow (rows x mask entries, a MultiDiscrete action's choices side by side; None when the
    env has no action mask)."""
    a = len(info.env.agents)
    n = k * a
    space, action = info.env.observation_space, info.env.action_space
    obs = valid_obs(space, n)
    leaves = codec.space_leaves(space) if codec.is_structured(space) else []
    widths = mask_widths(action)
    starts = np.cumsum([0, *widths[:-1]])
    masks = [
        j for j, leaf in enumerate(leaves)
        if leaf.name == MASK_LEAF and widths and int(np.prod(leaf.shape)) == sum(widths)
    ]  # fmt: skip
    for t in range(frames):
        s = t % AGENT_EPISODE
        reward = np.zeros(n, np.float32)
        terminated, truncated, acting = (np.zeros(n, np.bool_) for _ in range(3))
        for i in range(k):
            leaver = i % a if a > 1 else -1
            left = s > 3
            players = [j for j in range(a) if not (j == leaver and s >= 3)]
            for j in range(a):
                row = i * a + j
                if j == leaver and s == 3:
                    truncated[row] = True
                elif s == AGENT_EPISODE - 1 and not (j == leaver and left):
                    terminated[row] = True
                if s > 0 and not (j == leaver and left):
                    reward[row] = rng.uniform(-1, 1)
            if s < AGENT_EPISODE - 1:
                acting[i * a + players[s % len(players)]] = True
        allowed = None
        if masks:
            allowed = np.zeros((n, sum(widths)), np.bool_)
            for r in np.flatnonzero(acting):  # each choice allows about half, at least one
                allowed[r] = rng.random(sum(widths)) < 0.5
                for start, width in zip(starts, widths, strict=True):
                    allowed[r, start + rng.integers(width)] = True
            assert isinstance(obs, list)
            leaf = leaves[masks[0]]
            obs[masks[0]] = allowed.reshape(n, *leaf.shape).astype(leaf.dtype)
        yield frame(info, obs, reward, terminated, truncated, acting), allowed


@check("agent-actions-reply")
def _agent_actions_reply(ctx: LearnerContext) -> list[str]:
    info = ctx.need_info()
    _multi_agent(info)
    k = ctx.config.num_envs
    stream = ctx.stream()
    reply = stream.exchange(hello(info, k))
    if isinstance(reply, Ended) or reply.WhichOneof("kind") != "accept":
        stream.cancel()
        raise Skip("the Hello was not accepted (see hello-accepted)")
    problems = []
    frames = max(ctx.config.frames, 2 * AGENT_EPISODE)
    for n, (message, allowed) in enumerate(
        _agent_script(info, k, frames, np.random.default_rng(1))
    ):
        problem = actions_problem(stream.exchange(message), info, k, allowed)
        if problem:
            problems.append(f"frame {n} (of episode frame {n % AGENT_EPISODE}): {problem}")
            break
    stream.half_close()
    return problems


@check("field-order-served")
def _field_order_served(ctx: LearnerContext) -> list[str]:
    """The four tensors (and acting) last field first: the same Frame another encoder
    may write."""
    info = ctx.need_info()
    k = ctx.config.num_envs
    canonical = frame(info, valid_obs(info.env.observation_space, rows(info, k))).frame
    obs_field = "observation_leaves" if canonical.observation_leaves else "observations"
    names: tuple[str, ...] = ("truncated", "terminated", "rewards", obs_field)
    if info.env.agents:
        names = ("acting", *names)
    reordered = b"".join(
        pb.ActorMessage(frame=pb.Frame(**{name: getattr(canonical, name)})).SerializeToString()
        for name in names
    )
    stream = ctx.stream()
    reply = stream.exchange(hello(info, k))
    problems = []
    if isinstance(reply, Ended) or reply.WhichOneof("kind") != "accept":
        problems.append("the Hello was not accepted")
    else:
        for n in range(2):
            problem = actions_problem(stream.exchange(reordered), info, k)
            if problem:
                problems.append(f"reordered frame {n}: {problem}")
                break
    stream.half_close()
    return problems


@check("oversized-message")
def _oversized_message(ctx: LearnerContext) -> list[str]:
    info = ctx.need_info()
    limit = info.max_message_bytes
    if limit > OVERSIZE_LIMIT:
        raise Skip(f"max_message_bytes {limit} is more than this check sends ({OVERSIZE_LIMIT})")
    k = ctx.config.num_envs
    big = frame(info, valid_obs(info.env.observation_space, rows(info, k)))
    f = big.frame
    (f.observation_leaves[0] if f.observation_leaves else f.observations).data = bytes(limit + 1)
    problem = _refused(
        ctx,
        "a Frame above max_message_bytes",
        [hello(info, k), big],
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    )
    return [problem] if problem else []


@check("frame-stack-accepted")
def _frame_stack_accepted(ctx: LearnerContext) -> list[str]:
    info = ctx.need_info()
    d = info.frame_stack
    if d <= 1:
        raise Skip("the learner offers no frame stacking")
    k = ctx.config.num_envs
    problems = []
    for label, stack, obs in (
        (
            "newest frames",
            d,
            valid_obs(info.env.observation_space, rows(info, k), newest_only=True),
        ),
        ("whole stacks", 0, valid_obs(info.env.observation_space, rows(info, k))),
    ):
        stream = ctx.stream()
        reply = stream.exchange(hello(info, k, frame_stack=stack))
        if isinstance(reply, Ended) or reply.WhichOneof("kind") != "accept":
            problems.append(f"{label}: the Hello with frame_stack {stack} was not accepted")
        else:
            for n in range(3):
                problem = actions_problem(stream.exchange(frame(info, obs)), info, k)
                if problem:
                    problems.append(f"{label}, frame {n}: {problem}")
                    break
        stream.half_close()
    return problems


@check("bad-stream-isolated")
def _bad_stream_isolated(ctx: LearnerContext) -> list[str]:
    _good_step(ctx)
    if ctx.bad_streams == 0:
        raise Skip("no bad stream was run (select rejects-bad-hello or rejects-bad-frame too)")
    problems = list(ctx.good_problems)
    if ctx.good is not None:
        ctx.good.half_close()
    return problems


@check("shutdown-message")
def _shutdown_message(ctx: LearnerContext) -> list[str]:
    wait = ctx.config.wait_shutdown_s
    if wait <= 0:
        raise Skip("--wait-shutdown-s is 0")
    info = ctx.need_info()
    k = ctx.config.num_envs
    stream = ctx.stream()
    reply = stream.exchange(hello(info, k))
    if isinstance(reply, Ended) or reply.WhichOneof("kind") != "accept":
        return ["the Hello was not accepted"]
    obs = valid_obs(info.env.observation_space, rows(info, k))
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        reply = stream.exchange(frame(info, obs))
        if isinstance(reply, Ended):
            return [f"the stream ended with {reply.code.name} ({reply.details!r}) and no Shutdown"]
        if reply.WhichOneof("kind") == "shutdown":
            ended = stream.half_close()
            if ended.code not in (
                grpc.StatusCode.OK,
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.CANCELLED,
            ):
                return [
                    f"after the Shutdown and our half-close the stream ended with {ended.code.name}"
                ]
            return []
        problem = actions_problem(reply, info, k)
        if problem:
            return [problem]
    stream.cancel()
    return [f"the learner sent no Shutdown within {wait:g} s (it must stop on its own meanwhile)"]


# ---------------------------------------------------------------------- the suite


def run_learner_suite(target: str, config: LearnerSuiteConfig) -> Report:
    """Run the selected learner cases against the learner at ``target``."""
    cases = select("learner", config.only)
    token = resolve_auth_token(config.auth_token)
    channel = client_channel(
        target, config.tls_ca, config.tls_server_name, max_message_bytes=OVERSIZE_LIMIT + 2**20
    )
    ctx = LearnerContext(channel, replace(config), token)
    try:
        try:
            ctx.info = pb.LearnerInfo.FromString(
                channel.unary_unary("/seedrl.v1.Learner/GetInfo")(
                    b"", metadata=ctx.metadata, timeout=config.call_timeout_s
                )
            )
        except grpc.RpcError as exc:
            ctx.info_error = f"{exc.code().name}: {exc.details()}"
        except DecodeError:
            ctx.info_error = "the reply does not parse as a LearnerInfo"
        env = ctx.info.env.env_id if ctx.info is not None else "?"
        report = Report("learner", target, env)
        for case in cases:
            report.verdicts.append(_judge(case, ctx))
    finally:
        if ctx.good is not None:
            ctx.good.cancel()
        channel.close()
    return report


def _judge(case: Case, ctx: LearnerContext) -> Verdict:
    try:
        problems = CHECKS[case.id](ctx)
    except Skip as reason:
        return Verdict(case, Status.SKIP, str(reason))
    if not problems:
        return Verdict(case, Status.PASS)
    shown = "; ".join(problems[:4]) + (
        f"; and {len(problems) - 4} more" if len(problems) > 4 else ""
    )
    return Verdict(case, Status.FAIL, shown)
