"""Frame-once sending: actors send the newest frame of a stacked observation, the learner
keeps the stack per slot and stores single frames, with the same results as whole stacks."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
import torch
from support import engine_for

from actors.actor import Actor, StreamEnd
from learner.agents.models import action_head, build_model
from learner.serving.batcher import PendingRequest
from learner.serving.inference import Connection, FramePayload, StepCounter
from learner.serving.servicer import LearnerServicer
from learner.state.stats import LearnerStats
from learner.state.trajectories import (
    TrajectoryBuilder,
    UnrollQueue,
    Unrolls,
    stack_unroll_frames,
    stored_frame_stack,
)
from learner.training.trainer import to_time_major
from seedrl import codec, envs
from seedrl.config import ActorConfig, LearnerConfig
from seedrl.proto import seedrl_pb2 as pb

pytest.importorskip("ale_py")

ENV = "ALE/Pong-v5"
# Short episodes, so episode starts fall at several rows of the unrolls.
KWARGS = {"max_num_frames_per_episode": 120}
T = 4
K = 3
STEPS = 64


def test_atari_stacks_shift_by_one_frame_and_start_episodes_from_zeros():
    """The rule the learner rebuilds stacks by, checked against ale-py itself."""
    for kwargs in (KWARGS, {**KWARGS, "episodic_life": True}):
        vec = envs.make_vector_env("ALE/Breakout-v5", kwargs, 2)
        try:
            obs, _ = vec.reset(seed=1)
            assert not obs[:, :-1].any() and obs[:, -1].any()
            rng = np.random.default_rng(0)
            done = np.zeros(2, bool)
            starts = 0
            for _ in range(150):
                prev = obs.copy()
                obs, _, terminated, truncated, _ = vec.step(rng.integers(0, 4, 2))
                for i in range(2):
                    expected = np.zeros_like(prev[i, 1:]) if done[i] else prev[i, 1:]
                    np.testing.assert_array_equal(obs[i, :-1], expected)
                starts += int(done.sum())
                done = terminated | truncated
            assert starts > 2
        finally:
            vec.close()


def test_only_known_stacked_envs_send_frames_once():
    assert envs.frame_stack(ENV, {}) == 4
    assert envs.frame_stack(ENV, {"stack_num": 1}) == 1
    assert envs.frame_stack("CartPole-v1", {}) == 1
    assert stored_frame_stack(LearnerConfig(env=ENV)) == 4
    assert stored_frame_stack(LearnerConfig(env=ENV, frame_once=False)) == 1
    assert stored_frame_stack(LearnerConfig(env=ENV, normalize_observations=True)) == 1


def _engine(model, head, frame_stack: int, lstm_size: int):
    builder = TrajectoryBuilder(
        unroll_length=T, obs_shape=(4, 84, 84), obs_dtype="uint8",
        action_shape=head.action_shape, action_dtype="int64", param_size=head.param_size,
        core_state_sizes=(lstm_size, lstm_size) if lstm_size else (), frame_stack=frame_stack,
    )  # fmt: skip
    queue = UnrollQueue(100_000)
    engine = engine_for(
        model, head, torch.device("cpu"), builder, queue, LearnerStats(), threading.Lock(),
        StepCounter(), "torch", seed=5,
    )  # fmt: skip
    conn = Connection("a", "r", "peer", K, builder.allocate(K))
    return engine, queue, conn


async def _serve_one(engine, conn, obs: bytes, reward, terminated, truncated) -> np.ndarray:
    loop = asyncio.get_running_loop()
    payload = FramePayload(
        conn, obs, reward.astype(np.float32).tobytes(), terminated.tobytes(), truncated.tobytes()
    )
    request = PendingRequest(payload, K, loop.create_future())
    await engine.process([request])
    return np.array(request.future.result())


def _all_unrolls(queue: UnrollQueue) -> Unrolls:
    unrolls = queue.get(len(queue), timeout=1)
    assert unrolls is not None
    return unrolls


@pytest.mark.parametrize("lstm_size", [0, 32])
def test_frames_sent_once_give_the_unrolls_of_whole_stacks(lstm_size):
    """Three learners on one seeded Atari run: whole stacks stored (the old path), newest
    frames sent (new actors) and whole stacks sent to a frame-once learner (old actors).
    Every action and every unroll field agrees; the stacks rebuilt from frames for
    training are the stacks that were sent."""
    torch.manual_seed(0)
    vec = envs.make_vector_env(ENV, KWARGS, K)
    spec = envs.describe_env(ENV, KWARGS)
    head = action_head(spec.action_space)
    # A small MLP over the pixels: what is compared is the data path, not the torso.
    model = build_model(spec.observation_space, head, "mlp", (32,), lstm_size)
    servicer = LearnerServicer(LearnerConfig(env=ENV, env_kwargs=KWARGS), spec, *[None] * 4)
    keep_newest = servicer.frame_layout(K).keep_newest
    assert keep_newest is not None
    assert servicer.frame_layout(K, newest_frame_only=True).keep_newest is None
    whole, whole_q, whole_conn = _engine(model, head, 1, lstm_size)
    once, once_q, once_conn = _engine(model, head, 4, lstm_size)
    mixed, mixed_q, mixed_conn = _engine(model, head, 4, lstm_size)

    async def run() -> int:
        obs, _ = vec.reset(seed=7)
        reward = np.zeros(K, np.float32)
        terminated = truncated = np.zeros(K, bool)
        starts = 0
        for _ in range(STEPS):
            flags = (reward, terminated, truncated)
            stacks = np.ascontiguousarray(obs).tobytes()
            newest = np.ascontiguousarray(obs[:, -1]).tobytes()
            rng_state = torch.get_rng_state()  # the torch policy samples from torch's RNG
            action = await _serve_one(whole, whole_conn, stacks, *flags)
            torch.set_rng_state(rng_state)
            got_once = await _serve_one(once, once_conn, newest, *flags)
            torch.set_rng_state(rng_state)
            got_mixed = await _serve_one(mixed, mixed_conn, keep_newest(stacks), *flags)
            np.testing.assert_array_equal(got_once, action)
            np.testing.assert_array_equal(got_mixed, action)
            starts += int((terminated | truncated).sum())
            obs, reward, terminated, truncated, _ = vec.step(action)
        return starts

    try:
        assert asyncio.run(run()) >= K  # every env started a second episode
    finally:
        vec.close()

    reference = _all_unrolls(whole_q)
    assert len(reference) == K * ((STEPS - 1) // T)
    # An episode starts in the last rows of an unroll that has a successor: the next
    # unroll's row 0 stack then holds the zeros of that fresh stack.
    assert reference.first[:-K, T - 2 :].any()
    for unrolls in (_all_unrolls(once_q), _all_unrolls(mixed_q)):
        assert unrolls.frame_stack == 4 and reference.frame_stack == 1
        assert unrolls.obs.shape[1:] == (T + 4, 84, 84)
        rebuilt = stack_unroll_frames(unrolls.obs, unrolls.first)
        np.testing.assert_array_equal(rebuilt, reference.obs)
        trained = to_time_major(unrolls, torch.device("cpu"))
        expected = to_time_major(reference, torch.device("cpu"))
        for name, tensor in expected.items():
            assert torch.equal(trained[name], tensor), name
        for name in ("first", "reward", "terminated", "truncated", "action", "policy_params"):
            np.testing.assert_array_equal(getattr(unrolls, name), getattr(reference, name))
        for got, want in zip(unrolls.core_state, reference.core_state, strict=True):
            np.testing.assert_array_equal(got, want)


def test_the_learner_offers_frames_once_and_checks_the_hello():
    spec = envs.describe_env(ENV, {})
    servicer = LearnerServicer(LearnerConfig(env=ENV), spec, *[None] * 4)
    off = LearnerServicer(LearnerConfig(env=ENV, frame_once=False), spec, *[None] * 4)
    info = asyncio.run(servicer.GetInfo(pb.GetInfoRequest(), None))
    assert info.frame_stack == 4
    assert asyncio.run(off.GetInfo(pb.GetInfoRequest(), None)).frame_stack == 0

    def hello(frame_stack: int) -> pb.Hello:
        return pb.Hello(
            protocol_version=1, actor_id="a", run_id="r", num_envs=2, env=spec,
            frame_stack=frame_stack,
        )  # fmt: skip

    assert servicer._check_hello(hello(4)) is None
    assert servicer._check_hello(hello(0)) is None
    assert "frame_stack 3" in (servicer._check_hello(hello(3)) or "")
    assert "frame_stack 4" in (off._check_hello(hello(4)) or "")
    assert off._check_hello(hello(0)) is None
    assert servicer.frame_layout(2, newest_frame_only=True).observations.shape == [2, 84, 84]
    assert off.frame_layout(2).keep_newest is None


class ScriptedStream:
    """The learner's side of an Act stream for one actor: Accept, then zero actions for
    ``frames`` frames, then the end of the stream; keeps what the actor wrote."""

    def __init__(self, frames: int, k: int) -> None:
        self.written: list[bytes] = []
        self._left = frames
        self._actions = codec.actions_template(np.dtype(np.int64), (k,)).fill([bytes(8 * k)])

    def write(self, data: bytes) -> bool:
        self.written.append(data)
        return True

    def read(self) -> bytes | None:
        return pb.LearnerMessage(accept=pb.Accept(learner_run_id="x")).SerializeToString()

    def exchange(self, data: bytes) -> bytes | None:
        self.written.append(data)
        self._left -= 1
        return self._actions if self._left >= 0 else None

    def raise_for_status(self) -> None:
        return None


@pytest.mark.parametrize(
    ("env", "offer", "newest_only"),
    [(ENV, 4, True), (ENV, 0, False), ("CartPole-v1", 4, False)],
)
def test_the_actor_sends_the_newest_frame_when_offered(env, offer, newest_only):
    """Only observations that are stacks of the offered depth are sent frame by frame."""
    k, frames = 2, 40
    kwargs = KWARGS if env == ENV else {}
    actor = Actor(ActorConfig(envs_per_actor=k, seed=11), index=0)
    spec = actor._ensure_envs(pb.LearnerInfo(env=envs.describe_env(env, kwargs)))
    stream = ScriptedStream(frames, k)
    try:
        assert actor._stream_frames(stream, spec, offer) is StreamEnd.CLOSED  # type: ignore[arg-type]
    finally:
        assert actor.vec_env is not None
        actor.vec_env.close()
    hello = pb.ActorMessage.FromString(stream.written[0]).hello
    assert hello.frame_stack == (offer if newest_only else 0)
    sent = [pb.ActorMessage.FromString(raw).frame.observations for raw in stream.written[1:]]
    assert len(sent) == frames + 1

    vec = envs.make_vector_env(env, kwargs, k)
    try:
        obs, _ = vec.reset(seed=11)
        for tensor in sent:
            expected = obs[:, -1] if newest_only else obs
            assert list(tensor.shape) == [k, *expected.shape[1:]]
            np.testing.assert_array_equal(codec.decode_tensor(tensor, "obs"), expected)
            obs, *_ = vec.step(np.zeros(k, np.int64))  # the same actions the actor took
    finally:
        vec.close()
