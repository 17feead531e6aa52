"""Hostile and broken input against a real learner process.

One learner (module fixture) trains with a real actor process beside it and a
well-behaved in-test client; every bad stream must end with a status and a message
saying what was wrong, while both good actors keep being served and the learner
never dies. The hypothesis fuzz drives the server's own validation in-process.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
import uuid

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import actor_args, engine_for, learner_process, running, wait_until
from wire_clients import HeldStream, act, child_pids, frame, get_info, hello, lockstep, stub

from learner.parts import build_learner
from learner.serving.batcher import DynamicBatcher, PendingRequest
from learner.serving.inference import (
    Connection,
    FramePayload,
    gather_frames,
    nonfinite_problem,
)
from learner.serving.servicer import LearnerServicer
from learner.state.stats import LearnerStats
from seedrl import PROTOCOL_VERSION, codec
from seedrl.config import LearnerConfig
from seedrl.envs import describe_env
from seedrl.proto import seedrl_pb2 as pb

MAX_MESSAGE_BYTES = 200_000
MAX_ENVS = 64  # the real actor (4 envs) and the good client (2) leave 58
K = 2
INVALID = grpc.StatusCode.INVALID_ARGUMENT
HELLO_TIMEOUT_S = 2.0
IDLE_TIMEOUT_S = 4.0


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(channel, env spec, good client, learner proc, actor launcher proc)."""
    logdir = tmp_path_factory.mktemp("bad_input")
    env = {"SEEDRL_LOG_LEVEL": "INFO"}
    extra = [
        "--max-message-bytes", str(MAX_MESSAGE_BYTES), "--max-envs", str(MAX_ENVS),
        "--max-envs-per-peer", str(MAX_ENVS),  # every client here is one peer (loopback)
        "--hello-timeout-s", str(HELLO_TIMEOUT_S), "--stream-idle-timeout-s", str(IDLE_TIMEOUT_S),
    ]  # fmt: skip
    with learner_process(logdir, *extra, env=env) as (learner, port):
        with running(actor_args(port, 1, 4), env=env) as actors:
            wait_until(lambda: child_pids(actors.popen.pid), 30, what="actor process")
            actor_pid = child_pids(actors.popen.pid)[0]
            learner.wait_for("connected from", 60)
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                spec = get_info(channel).env
                with lockstep(channel, spec, K) as good:
                    yield channel, spec, good, learner, actors
                    # The real actor was never dropped: same process, one connection.
                    assert child_pids(actors.popen.pid) == [actor_pid]
                    assert learner.popen.poll() is None, learner.output()
                    actor_id = f"-{actor_pid}-0'"
                    log = learner.lines
                    assert sum(actor_id in line and "connected from" in line for line in log) == 1
                    assert not any(actor_id in line and "disconnected" in line for line in log)
                    assert not any("Traceback" in line for line in log), learner.output()


def _obs(k: int = K, dim: int = 4, dtype: str = "float32", fill: float = 0.01) -> np.ndarray:
    return np.full((k, dim), fill, dtype=dtype)


def _truncated_obs(k: int = K) -> pb.ActorMessage:
    message = frame(k)
    message.frame.observations.data = message.frame.observations.data[:-3]
    return message


def _space(env: pb.EnvSpec, **changes: object) -> pb.EnvSpec:
    changed = pb.EnvSpec()
    changed.CopyFrom(env)
    for path, value in changes.items():
        space_name, attr = path.split("__")
        space = getattr(changed, space_name)
        if attr == "shape":
            space.shape[:] = value
        else:
            setattr(space, attr, value)
    return changed


def _env_id(env: pb.EnvSpec, env_id: str) -> pb.EnvSpec:
    changed = pb.EnvSpec()
    changed.CopyFrom(env)
    changed.env_id = env_id
    return changed


# (case, messages(env) -> list, expected status, words the message must contain)
CASES = {
    "frame before hello": (lambda e: [frame(K)], INVALID, "first message must be a Hello"),
    "empty first message": (lambda e: [pb.ActorMessage()], INVALID, "must be a Hello"),
    "unknown protocol version": (
        lambda e: [hello(e, K, protocol_version=PROTOCOL_VERSION + 98)],
        INVALID,
        f"protocol version {PROTOCOL_VERSION + 98} is not supported",
    ),
    "wrong env id": (
        lambda e: [hello(_env_id(e, "MountainCar-v0"), K)],
        INVALID,
        "actor runs env 'MountainCar-v0'",
    ),
    "observation space differs": (
        lambda e: [hello(_space(e, observation_space__shape=[5]), K)],
        INVALID,
        "observation_space Box(shape=[5]",
    ),
    "action space differs": (
        lambda e: [hello(_space(e, action_space__n=3), K)],
        INVALID,
        "action_space Discrete(3) differs",
    ),
    "zero envs": (lambda e: [hello(e, 0)], INVALID, "num_envs must be in"),
    "too many envs": (lambda e: [hello(e, 100_000)], INVALID, "num_envs must be in"),
    "more envs than --max-envs": (
        lambda e: [hello(e, 60)],
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "6 envs in use + 60 asked exceeds --max-envs 64",
    ),
    "empty run id": (lambda e: [hello(e, K, run_id="")], INVALID, "run_id is empty"),
    "second hello": (lambda e: [hello(e, K), hello(e, K)], INVALID, "only Frame messages"),
    "obs wrong shape": (
        lambda e: [hello(e, K), frame(K, obs=_obs(dim=5))],
        INVALID,
        "observations: shape [2, 5] but expected [2, 4]",
    ),
    "obs wrong dtype": (
        lambda e: [hello(e, K), frame(K, obs=_obs(dtype="float64"))],
        INVALID,
        "observations: dtype float64 but expected float32",
    ),
    "obs byte length": (
        lambda e: [hello(e, K), _truncated_obs()],
        INVALID,
        "observations: 29 bytes but dtype float32 and shape [2, 4] need 32",
    ),
    "obs NaN": (
        lambda e: [hello(e, K), frame(K, obs=_obs(fill=float("nan")))],
        INVALID,
        "observations: contains NaN or inf",
    ),
    "obs inf": (
        lambda e: [hello(e, K), frame(K, obs=_obs(fill=float("-inf")))],
        INVALID,
        "observations: contains NaN or inf",
    ),
    "reward NaN": (
        lambda e: [hello(e, K), frame(K, reward=np.array([1.0, np.nan], np.float32))],
        INVALID,
        "rewards: contains NaN or inf",
    ),
    "reward wrong dtype": (
        lambda e: [hello(e, K), frame(K, reward=np.ones(K, np.float64))],
        INVALID,
        "rewards: dtype float64 but expected float32",
    ),
    "terminated not bool": (
        lambda e: [hello(e, K), frame(K, terminated=np.zeros(K, np.uint8))],
        INVALID,
        "terminated: dtype uint8 but expected bool",
    ),
    "K changes mid-stream": (
        lambda e: [hello(e, K), frame(K), frame(K + 1)],
        INVALID,
        "observations carry 3 envs but the Hello declared num_envs=2",
    ),
    "frame for an env that does not exist": (
        lambda e: [hello(e, K), frame(K, terminated=np.zeros(K + 1, np.bool_))],
        INVALID,
        "terminated: shape [3] but expected [2]",
    ),
    "message over --max-message-bytes": (
        lambda e: [hello(e, K), frame(K, obs=_obs(dim=MAX_MESSAGE_BYTES // 8 + 1000))],
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "larger than max",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_stream_ends_alone_with_a_clear_status(served, case):
    channel, env, good, _learner, _actors = served
    build, code, words = CASES[case]
    outcome = act(channel, build(env))
    assert outcome.code == code, (case, outcome)
    assert words in outcome.details, (case, outcome.details)
    good.wait_for_more(5)


def test_k_change_is_caught_after_serving_the_good_frames(served):
    channel, env, good, _learner, _actors = served
    outcome = act(channel, [hello(env, K), frame(K), frame(K), frame(K + 1)])
    kinds = [r.WhichOneof("kind") for r in outcome.replies]
    assert kinds == ["accept", "actions", "actions"], kinds
    assert outcome.code == INVALID
    good.wait_for_more(5)


def test_undecodable_bytes_mid_stream_end_the_stream_cleanly(served):
    """Act checks parse failures itself (no interceptor wrapper on the hot path)."""
    channel, env, good, _learner, _actors = served
    chunks = [hello(env, K).SerializeToString(), frame(K).SerializeToString(), b"\xff" * 40]
    replies = channel.stream_stream("/seedrl.v1.Learner/Act")(iter(chunks), timeout=10)
    kinds = []
    with pytest.raises(grpc.RpcError) as caught:
        for raw in replies:
            kinds.append(pb.LearnerMessage.FromString(raw).WhichOneof("kind"))
    assert kinds == ["accept", "actions"]
    assert caught.value.code() == INVALID
    assert "Act: request is not a valid protobuf message" in caught.value.details()
    good.wait_for_more(5)


def test_a_valid_frame_in_another_field_order_is_served(served):
    """Frames that miss the no-parse template (another encoder's bytes) take the full parse."""
    channel, env, good, _learner, _actors = served
    canonical = frame(K)
    reordered = b"".join(
        pb.ActorMessage(
            frame=pb.Frame(**{name: getattr(canonical.frame, name)})
        ).SerializeToString()
        for name in ("truncated", "terminated", "rewards", "observations")
    )
    assert reordered != canonical.SerializeToString()
    assert pb.ActorMessage.FromString(reordered) == canonical
    chunks = [hello(env, K).SerializeToString(), reordered, canonical.SerializeToString()]
    replies = channel.stream_stream("/seedrl.v1.Learner/Act")(iter(chunks), timeout=10)
    messages = [pb.LearnerMessage.FromString(raw) for raw in replies]
    assert [m.WhichOneof("kind") for m in messages] == ["accept", "actions", "actions"]
    for message in messages[1:]:
        actions = codec.decode_tensor(message.actions.actions, "actions", np.int64, (K,))
        assert set(actions.tolist()) <= {0, 1}
    good.wait_for_more(5)


def test_a_stream_that_sends_no_hello_is_ended(served):
    """A connection that never says who it is ends after --hello-timeout-s."""
    channel, _env, good, _learner, _actors = served
    release = threading.Event()

    def nothing():
        release.wait(30)
        yield from ()

    began = time.monotonic()
    call = stub(channel).Act(nothing(), timeout=30)
    try:
        with pytest.raises(grpc.RpcError) as caught:
            next(call)
    finally:
        release.set()
    elapsed = time.monotonic() - began
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert f"no Hello within {HELLO_TIMEOUT_S:g} s" in caught.value.details()
    assert HELLO_TIMEOUT_S - 0.1 <= elapsed < 20, elapsed
    good.wait_for_more(5)


def test_a_silent_admitted_stream_is_ended_and_its_place_freed(served):
    """An admitted actor that stops sending (its connection alive) loses its place and its
    K env slots after --stream-idle-timeout-s; the others are served throughout."""
    channel, env, good, learner, _actors = served
    room = MAX_ENVS - 4 - K  # what the real actor and the good client leave
    held = HeldStream(channel, env, num_envs=room, frames=2, actor_id="silent-actor")
    try:
        # While it is admitted, its envs are taken: one more stream does not fit.
        outcome = act(channel, [hello(env, K)])
        assert outcome.code == grpc.StatusCode.RESOURCE_EXHAUSTED, outcome
        good.wait_for_more(5)
        code, details = held.status(timeout=IDLE_TIMEOUT_S + 20)
        silent_for = time.monotonic() - held.last_reply_at
    finally:
        held.close()
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED, (code, details)
    assert f"no frame for {IDLE_TIMEOUT_S:g} s after the last reply" in details
    assert silent_for >= IDLE_TIMEOUT_S - 0.1, silent_for
    learner.wait_for("'silent-actor' sent no frame", 10)
    # Its place and all its env slots are free again: a stream of that size is served.
    outcome = act(channel, [hello(env, room), frame(room)])
    assert outcome.code == grpc.StatusCode.OK, outcome
    assert [r.WhichOneof("kind") for r in outcome.replies] == ["accept", "actions"]
    good.wait_for_more(5)


METHODS = (
    "/seedrl.v1.Learner/Act",
    "/seedrl.v1.Learner/GetInfo",
    "/grpc.health.v1.Health/Check",
    "/grpc.health.v1.Health/Watch",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    "/no.such.Service/Method",
)
# A parse failure is INVALID_ARGUMENT; bytes that happen to parse get the method's own
# answer (OK, or Act's "first message must be a Hello"); Watch on a parsed request
# streams until the deadline; unknown methods are UNIMPLEMENTED.
FITTING = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNIMPLEMENTED,
}


def test_random_bytes_to_every_method(served):
    """Identity serializers: raw random bytes, unary and streaming, on every method."""
    channel, _env, good, _learner, _actors = served
    rng = random.Random(1234)
    seen: dict[str, set[grpc.StatusCode]] = {}
    for method in METHODS:
        for trial in range(12):
            chunks = [rng.randbytes(rng.randrange(1, 300)) for _ in range(rng.randrange(1, 4))]
            if trial == 0:
                chunks = [b"\xff" * 40]  # never a valid protobuf: a malformed tag
            try:
                if trial % 2:
                    responses = channel.stream_stream(method)(iter(chunks), timeout=2)
                    for _ in responses:
                        pass
                else:
                    channel.unary_unary(method)(chunks[0], timeout=2)
                code = grpc.StatusCode.OK
            except grpc.RpcError as exc:
                code = exc.code()
                if code == INVALID:
                    assert exc.details(), method
            seen.setdefault(method, set()).add(code)
            assert code in FITTING, (method, code)
        good.wait_for_more(2)
    for method in METHODS[:-1]:
        assert INVALID in seen[method], (method, seen[method])
    assert seen["/no.such.Service/Method"] == {grpc.StatusCode.UNIMPLEMENTED}


# ------------------------------------------------------------------ in-process fuzz


@pytest.fixture(scope="module")
def servicer():
    config = LearnerConfig(env="CartPole-v1")
    spec = describe_env(config.env, config.env_kwargs)
    stub_parts = None  # _check_hello and frame_payload touch none of the serving parts
    return LearnerServicer(config, spec, stub_parts, stub_parts, stub_parts, stub_parts)


def test_replies_are_the_actions_message_for_any_action_layout(servicer):
    """A stream's reply encoding (a template joined with one payload for the action space's
    layout, the full encoder for any other) gives the message protobuf would write."""
    k = 3
    encode = servicer.reply_encoder(k)
    for actions in (
        np.array([0, 1, 1], np.int64),  # the layout of the action space: the template
        np.array([1, 0, 1], np.int32),  # another dtype
        np.array([[1], [0], [1]], np.int64),  # another shape
    ):
        expected = pb.LearnerMessage(actions=pb.Actions(actions=codec.encode_tensor(actions)))
        assert encode(actions) == expected.SerializeToString(), actions


DTYPES = [*sorted(codec.ALLOWED_DTYPES), "float128", "object", "<f4", "", "V8", "x" * 64]


def tensors(k: int) -> st.SearchStrategy[pb.Tensor]:
    arbitrary = st.builds(
        lambda dtype, shape, data: pb.Tensor(dtype=dtype, shape=shape, data=data),
        st.sampled_from(DTYPES),
        st.lists(st.integers(-(2**63), 2**63 - 1) | st.integers(-2, 6), max_size=5),
        st.binary(max_size=64),
    )
    # Right shape and dtype with arbitrary float values (NaN, inf, subnormals...).
    plausible = st.builds(
        lambda values: codec.encode_tensor(np.array(values, np.float32).reshape(k, 4)),
        st.lists(st.floats(width=32), min_size=4 * k, max_size=4 * k),
    )
    return arbitrary | plausible


@st.composite
def frames(draw: st.DrawFn, k: int) -> pb.Frame:
    reward = draw(
        tensors(k)
        | st.builds(
            lambda v: codec.encode_tensor(np.array(v, np.float32)),
            st.lists(st.floats(width=32), min_size=k, max_size=k),
        )
    )
    flags = st.builds(
        lambda v: codec.encode_tensor(np.array(v, np.bool_)),
        st.lists(st.booleans(), min_size=k, max_size=k),
    )
    return pb.Frame(
        observations=draw(tensors(k)),
        rewards=reward,
        terminated=draw(flags | tensors(k)),
        truncated=draw(flags | tensors(k)),
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), k=st.integers(1, 3))
def test_fuzz_frame_validation(servicer, data, k):
    """Any Frame is either rejected with WireError or yields exactly what the trainer needs."""
    message = data.draw(frames(k))
    conn = Connection("fuzz", uuid.uuid4().hex, "peer", k, np.arange(k))
    try:
        payload = servicer.frame_payload(conn, servicer.frame_layout(k), message)
    except codec.WireError as exc:
        assert str(exc)
        return
    batch = gather_frames([payload], np.dtype(np.float32), (4,))
    problem = nonfinite_problem(batch)
    if problem is not None:  # the engine fails this stream's request with it
        assert "NaN or inf" in problem
        return
    assert batch.obs_BO.shape == (k, 4) and batch.obs_BO.dtype == np.float32
    assert np.isfinite(batch.obs_BO).all()
    assert batch.reward_B.shape == (k,) and batch.reward_B.dtype == np.float32
    assert np.isfinite(batch.reward_B).all()
    for flags in (batch.terminated_B, batch.truncated_B):
        assert flags.shape == (k,) and flags.dtype == np.bool_


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=200))
def test_fuzz_raw_bytes_through_parse_and_validation(servicer, data):
    """Arbitrary bytes: protobuf parse, then hello check and frame validation never crash."""
    try:
        message = pb.ActorMessage.FromString(data)
    except Exception:  # the server answers these with INVALID_ARGUMENT (DecodeGuard)
        return
    problem = servicer._check_hello(message.hello)
    assert problem is None or isinstance(problem, str)
    conn = Connection("fuzz", "run", "peer", 2, np.arange(2))
    with contextlib.suppress(codec.WireError):
        servicer.frame_payload(conn, servicer.frame_layout(2), message.frame)


@settings(max_examples=200, deadline=None)
@given(
    version=st.integers(0, 2**32 - 1),
    num_envs=st.integers(0, 2**32 - 1),
    run_id=st.text(max_size=8),
    env_id=st.sampled_from(["CartPole-v1", "Acrobot-v1", "", "x" * 200]),
    obs_shape=st.lists(st.integers(0, 8), max_size=3),
    n=st.integers(-3, 5),
)
def test_fuzz_hello_check(servicer, version, num_envs, run_id, env_id, obs_shape, n):
    """A Hello passes only when every field agrees with the learner; else a message says why."""
    env = pb.EnvSpec()
    env.CopyFrom(servicer.env_spec)
    env.env_id = env_id
    env.observation_space.shape[:] = obs_shape
    env.action_space.n = n
    message = pb.Hello(
        protocol_version=version, actor_id="f", run_id=run_id, num_envs=num_envs, env=env
    )
    problem = servicer._check_hello(message)
    agrees = (
        version == PROTOCOL_VERSION
        and 1 <= num_envs <= 4096
        and run_id != ""
        and env_id == "CartPole-v1"
        and obs_shape == [4]
        and n == 2
    )
    assert (problem is None) == agrees, problem
    if problem is not None:
        assert len(problem) > 10


@pytest.mark.parametrize("field", ["observations", "rewards"])
def test_nonfinite_frame_in_a_batch_fails_only_its_own_request(field):
    """NaN/inf are checked once per batch; the offending stream gets the error, the rest
    are served and recorded."""
    config = LearnerConfig(env="CartPole-v1")
    learner = build_learner(config)
    engine = engine_for(
        learner.model, learner.head, learner.device, learner.builder, learner.queue,
        learner.stats, learner.weights_lock, learner.step_counter,
    )  # fmt: skip
    k = 2
    conns = [Connection(f"a{i}", f"r{i}", "peer", k, learner.builder.allocate(k)) for i in range(3)]

    def payload(conn: Connection, bad: bool) -> FramePayload:
        obs, reward = np.ones((k, 4), np.float32), np.ones(k, np.float32)
        if bad:
            (obs if field == "observations" else reward).flat[-1] = np.inf
        flags = np.zeros(k, np.bool_).tobytes()
        return FramePayload(conn, obs.tobytes(), reward.tobytes(), flags, flags)

    async def one_batch() -> list[PendingRequest]:
        loop = asyncio.get_running_loop()
        batch = [
            PendingRequest(payload(conn, bad=i == 1), k, loop.create_future())
            for i, conn in enumerate(conns)
        ]
        await engine.process(batch)
        return batch

    batch = asyncio.run(one_batch())
    error = batch[1].future.exception()
    assert isinstance(error, codec.WireError)
    assert str(error) == f"{field}: contains NaN or inf"
    for request in (batch[0], batch[2]):
        assert request.future.result().shape == (k,)
    assert learner.stats.frames == 2 * k
    assert (conns[0].frames, conns[1].frames, conns[2].frames) == (k, 0, k)


def test_a_stream_waiting_for_the_learner_is_not_silent():
    """Only time the actor owes a frame counts: a frame the learner holds for many idle
    bounds (a batch forming, back-pressure) does not end the stream; once answered, the
    silent actor is ended after the bound."""
    bound, held_s = 0.2, 1.5
    config = LearnerConfig(env="CartPole-v1", stream_idle_timeout_s=bound)
    spec = describe_env(config.env, config.env_kwargs)
    k = 1
    hello_bytes = hello(spec, k).SerializeToString()
    frame_bytes = frame(k).SerializeToString()

    class Aborted(Exception):
        pass

    class SilentAfterOneFrame:
        """An Act context: Hello, one frame, then no more (the read never returns)."""

        def __init__(self) -> None:
            self.reads = [hello_bytes, frame_bytes]
            self.replies: list[float] = []
            self.status: tuple[grpc.StatusCode, str] | None = None

        async def read(self) -> bytes:
            if self.reads:
                return self.reads.pop(0)
            await asyncio.Event().wait()  # silent for ever
            raise AssertionError("unreachable")

        async def write(self, data: bytes) -> None:
            self.replies.append(time.monotonic())

        def peer(self) -> str:
            return "in-process"

        async def abort(self, code: grpc.StatusCode, details: str) -> None:
            self.status = (code, details)
            raise Aborted

    class SlotsAndEnds:
        def allocate(self, count: int) -> np.ndarray:
            return np.arange(count)

        def release_later(self, conn: Connection) -> None:
            conn.closed = True

    async def slow_learner(batch: list[PendingRequest]) -> None:
        await asyncio.sleep(held_s)  # the learner holds the frame, as back-pressure does
        for request in batch:
            request.payload.conn.frames += request.num_frames
            request.future.set_result(np.zeros(request.num_frames, np.int64))

    async def run() -> tuple[SilentAfterOneFrame, float, float]:
        batcher = DynamicBatcher(slow_learner, max_frames=1, timeout_s=0.01)
        ends = SlotsAndEnds()
        servicer = LearnerServicer(config, spec, batcher, ends, ends, LearnerStats())
        batching = asyncio.create_task(batcher.run())
        context = SilentAfterOneFrame()
        began = time.monotonic()
        with pytest.raises(Aborted):
            await asyncio.wait_for(servicer.Act(None, context), 30)
        ended = time.monotonic()
        servicer.begin_shutdown("test over", final=True)
        batching.cancel()
        assert not servicer.connections and servicer.stats.streams_timed_out == 1
        return context, began, ended

    context, began, ended = asyncio.run(run())
    assert context.status is not None
    assert context.status[0] == grpc.StatusCode.DEADLINE_EXCEEDED, context.status
    assert len(context.replies) == 2  # the Accept, then the actions after the long hold
    answered = context.replies[-1]
    assert answered - began >= held_s  # held for many bounds, and not ended meanwhile
    assert bound <= ended - answered < bound + 1.0, ended - answered
