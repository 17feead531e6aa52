"""Actors check the learner's actions against the action space before an env steps on them.

A discrete action outside its space, or a NaN/inf Box action, ends that connection with one
warning naming the row and the value; the envs are kept (and never stepped on it), and the
backoff grows across such connections, so a learner that keeps sending them gets no tight
reconnect loop. Out-of-bounds but finite Box actions are normal (Gaussian policies) and are
clipped as before.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import gymnasium as gym
import numpy as np
import pytest

from actors import actor as actor_module
from actors.actor import Actor, StepWire
from seedrl import PROTOCOL_VERSION, codec, envs
from seedrl.config import ActorConfig
from seedrl.proto import seedrl_pb2 as pb
from seedrl.proto import seedrl_pb2_grpc as pb_grpc

BAD_STREAMS = 3


class BadActionsLearner(pb_grpc.LearnerServicer):
    """Accepts every Hello and answers the first frame of the first BAD_STREAMS streams
    with ``actions``; the next stream's first frame gets Shutdown{final: true}."""

    def __init__(self, env_id: str, actions: np.ndarray) -> None:
        self.env = envs.describe_env(env_id)
        self.actions = actions
        self.streams = 0
        self.frames_seen = 0

    def GetInfo(self, request: pb.GetInfoRequest, context: Any) -> pb.LearnerInfo:
        return pb.LearnerInfo(protocol_version=PROTOCOL_VERSION, env=self.env)

    def Act(self, request_iterator: Any, context: Any) -> Iterator[pb.LearnerMessage]:
        for message in request_iterator:
            if message.WhichOneof("kind") == "hello":
                self.streams += 1
                yield pb.LearnerMessage(accept=pb.Accept(learner_run_id="bad"))
                continue
            self.frames_seen += 1
            if self.streams > BAD_STREAMS:
                yield pb.LearnerMessage(shutdown=pb.Shutdown(reason="done", final=True))
                return
            tensor = codec.encode_tensor(self.actions)
            yield pb.LearnerMessage(actions=pb.Actions(actions=tensor))


@contextlib.contextmanager
def serving(fake: BadActionsLearner) -> Iterator[int]:
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(4))
    pb_grpc.add_LearnerServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield port
    finally:
        server.stop(0)


@pytest.mark.parametrize(
    "env_id, actions, says",
    [
        ("CartPole-v1", np.array([0, 2], np.int64), "outside [0, 2) for row 1: 2"),
        ("CartPole-v1", np.array([-1, 1], np.int64), "outside [0, 2) for row 0: -1"),
        ("Pendulum-v1", np.array([[0.5], [np.nan]], np.float32), "non-finite Box action for row 1"),
        ("Pendulum-v1", np.array([[np.inf], [0.0]], np.float32), "non-finite Box action for row 0"),
    ],
    ids=["discrete-too-high", "discrete-negative", "box-nan", "box-inf"],
)
def test_a_bad_action_ends_the_connection_not_the_env(monkeypatch, caplog, env_id, actions, says):
    made: list[gym.vector.VectorEnv] = []
    stepped: list[Any] = []
    real_make = envs.make_vector_env

    def make(*args: Any, **kwargs: Any) -> gym.vector.VectorEnv:
        vec_env = real_make(*args, **kwargs)
        real_step = vec_env.step

        def step(actions_KA: Any) -> Any:
            stepped.append(np.array(actions_KA))
            return real_step(actions_KA)

        vec_env.step = step  # type: ignore[method-assign]
        made.append(vec_env)
        return vec_env

    monkeypatch.setattr(actor_module.envs, "make_vector_env", make)
    fake = BadActionsLearner(env_id, actions)
    with serving(fake) as port:
        config = ActorConfig(
            learner=f"127.0.0.1:{port}", envs_per_actor=2, max_backoff_s=0.2, local_socket=False
        )
        actor = Actor(config, 0)
        result: list[int] = []
        thread = threading.Thread(target=lambda: result.append(actor.run()))
        with caplog.at_level(logging.WARNING, logger="actors.actor"):
            thread.start()
            thread.join(60)
        if thread.is_alive():
            actor.stop()
            thread.join(10)
        assert result == [0], "the actor ended at the final Shutdown"
    assert fake.streams == BAD_STREAMS + 1 and fake.frames_seen == BAD_STREAMS + 1
    assert stepped == [], "no env stepped on a bad action"
    assert len(made) == 1, "the envs are kept across the bad connections"
    assert actor.backoff.attempt == BAD_STREAMS, "the backoff grew across them"
    warnings = [r.getMessage() for r in caplog.records if "bad reply" in r.getMessage()]
    assert len(warnings) == BAD_STREAMS, warnings
    assert all(says in w and "reconnecting in" in w for w in warnings), warnings


def _wire(space: gym.Space, k: int) -> StepWire:
    obs = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    return StepWire(codec.env_spec("probe", {}, obs, space), k)


def _reply(wire: StepWire, *arrays: np.ndarray) -> bytes:
    if wire.structured_act:
        tensors = [codec.encode_tensor(a) for a in arrays]
        return pb.LearnerMessage(actions=pb.Actions(action_leaves=tensors)).SerializeToString()
    return pb.LearnerMessage(
        actions=pb.Actions(actions=codec.encode_tensor(arrays[0]))
    ).SerializeToString()


def test_each_kind_of_action_space_is_checked_and_good_actions_pass():
    multi = _wire(gym.spaces.MultiDiscrete([3, 5]), 2)
    good = np.array([[2, 4], [0, 0]], np.int64)
    np.testing.assert_array_equal(multi.actions(_reply(multi, good)), good)
    with pytest.raises(codec.WireError, match=r"nvec \[3, 5\]\) for row 1: \[1, 5\]"):
        multi.actions(_reply(multi, np.array([[2, 4], [1, 5]], np.int64)))

    binary = _wire(gym.spaces.MultiBinary(3), 2)
    dtype = binary.act_dtype
    assert binary.actions(_reply(binary, np.array([[1, 0, 1], [0, 0, 0]], dtype))).shape == (2, 3)
    with pytest.raises(codec.WireError, match=r"outside \[0, 2\) for row 0"):
        binary.actions(_reply(binary, np.array([[1, 2, 1], [0, 0, 0]], dtype)))

    box = _wire(gym.spaces.Box(-1.0, 1.0, (1,), np.float32), 2)
    clipped = box.actions(_reply(box, np.array([[7.0], [-0.5]], np.float32)))
    np.testing.assert_array_equal(clipped, [[1.0], [-0.5]])  # out of bounds: clipped, kept

    space = gym.spaces.Dict({"move": gym.spaces.Discrete(4), "push": gym.spaces.Box(0, 1, (2,))})
    leaves = _wire(space, 2)
    move = np.array([3, 1], np.int64)
    push = np.zeros((2, 2), np.float32)
    assert leaves.actions(_reply(leaves, move, push))["move"].tolist() == [3, 1]
    with pytest.raises(codec.WireError, match="outside \\[0, 4\\) for row 0 of leaf 'move': 4"):
        leaves.actions(_reply(leaves, np.array([4, 1], np.int64), push))
    push[1, 0] = np.nan
    with pytest.raises(codec.WireError, match="non-finite Box action for row 1 of leaf 'push'"):
        leaves.actions(_reply(leaves, move, push))
