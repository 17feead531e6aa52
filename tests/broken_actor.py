"""seedrl's own actor with one protocol rule broken, for the conformance suite's own tests.

    python tests/broken_actor.py BREAK [actor flags]

runs ``python -m actors actor`` after a one-line corruption named by BREAK (see
``BREAKS``; ``exit-on-restart`` is the real actor with ``--exit-on-shutdown``), so a
test can show that the suite fails the case guarding that rule, with a message that
says what went wrong.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors import actor as actor_module
from actors import process
from actors.actor import Actor, Backoff, StepWire
from actors.stream import LockstepStream
from seedrl import codec
from seedrl.envs.agents import AgentEnvs
from seedrl.proto import seedrl_pb2 as pb


def _wrap(cls: type, name: str, around: Callable[..., object]) -> None:
    original = getattr(cls, name)
    setattr(cls, name, lambda self, *a, **kw: around(original, self, *a, **kw))


def reuse_run_id() -> None:
    fixed = uuid.UUID(int=59)
    actor_module.uuid.uuid4 = lambda: fixed  # type: ignore[attr-defined]


def reset_reward() -> None:
    def reset(original, self, *args):  # type: ignore[no-untyped-def]
        obs, reward, terminated, truncated = original(self, *args)
        return obs, reward + 1.0, terminated, truncated

    _wrap(Actor, "_reset_envs", reset)


def swap_actions() -> None:
    def actions(original, self, data):  # type: ignore[no-untyped-def]
        got = original(self, data)
        return got if isinstance(got, pb.Shutdown) else got[::-1]

    _wrap(StepWire, "actions", actions)


def truncation_as_termination() -> None:
    def frame(original, self, obs, reward, terminated, truncated):  # type: ignore[no-untyped-def]
        return original(self, obs, reward, terminated | truncated, np.zeros_like(truncated))

    _wrap(StepWire, "frame", frame)


def reward_after_reset() -> None:
    ended: dict[int, np.ndarray] = {}

    def frame(original, self, obs, reward, terminated, truncated):  # type: ignore[no-untyped-def]
        previous = ended.get(id(self))
        ended[id(self)] = terminated | truncated
        if previous is not None and previous.any():
            reward = np.where(previous, np.float32(1.0), reward).astype(np.float32)
        return original(self, obs, reward, terminated, truncated)

    _wrap(StepWire, "frame", frame)


def _frame_message(obs, reward, terminated, truncated) -> bytes:  # type: ignore[no-untyped-def]
    message = pb.ActorMessage()
    for name, array in (
        ("observations", obs),
        ("rewards", reward),
        ("terminated", terminated),
        ("truncated", truncated),
    ):
        codec.encode_tensor(np.asarray(array), getattr(message.frame, name))
    return message.SerializeToString()


def leaves_reversed() -> None:
    def frame(original, self, *args):  # type: ignore[no-untyped-def]
        message = pb.ActorMessage.FromString(original(self, *args))
        leaves = list(message.frame.observation_leaves)[::-1]
        del message.frame.observation_leaves[:]
        message.frame.observation_leaves.extend(leaves)
        return message.SerializeToString()

    _wrap(StepWire, "frame", frame)


def k_changes() -> None:
    def frame(original, self, obs, reward, terminated, truncated):  # type: ignore[no-untyped-def]
        self.sent = getattr(self, "sent", 0) + 1
        if self.sent < 5:
            return original(self, obs, reward, terminated, truncated)
        return _frame_message(obs[:-1], reward[:-1], terminated[:-1], truncated[:-1])

    _wrap(StepWire, "frame", frame)


def float64_rewards() -> None:
    def frame(original, self, obs, reward, terminated, truncated):  # type: ignore[no-untyped-def]
        return _frame_message(obs, reward.astype(np.float64), terminated, truncated)

    _wrap(StepWire, "frame", frame)


def nan_observation() -> None:
    def frame(original, self, obs, reward, terminated, truncated):  # type: ignore[no-untyped-def]
        self.sent = getattr(self, "sent", 0) + 1
        if self.sent == 3:
            obs = np.array(obs, np.float32)
            obs[0, 0] = np.nan
        return original(self, obs, reward, terminated, truncated)

    _wrap(StepWire, "frame", frame)


def no_clip() -> None:
    def init(original, self, *args, **kwargs):  # type: ignore[no-untyped-def]
        original(self, *args, **kwargs)
        self.low = self.high = None

    _wrap(StepWire, "__init__", init)


def stack_unoffered() -> None:
    def init(original, self, spec, k, frame_stack=0):  # type: ignore[no-untyped-def]
        return original(self, spec, k, codec.spec_shape(spec.observation_space)[0])

    _wrap(StepWire, "__init__", init)


def wrong_stack() -> None:
    def init(original, self, *args, **kwargs):  # type: ignore[no-untyped-def]
        original(self, *args, **kwargs)
        if self.newest_of_stack:
            self.newest_of_stack += 1

    _wrap(StepWire, "__init__", init)


def no_auth() -> None:
    actor_module.auth_metadata = lambda token: ()  # type: ignore[attr-defined]


def wrong_kwargs() -> None:
    def ensure(original, self, info):  # type: ignore[no-untyped-def]
        spec = original(self, info)
        spec.env_kwargs_json = '{"sutton_barto_reward": true}'
        return spec

    _wrap(Actor, "_ensure_envs", ensure)


def wrong_version() -> None:
    actor_module.PROTOCOL_VERSION = 2  # type: ignore[attr-defined]


def second_hello() -> None:
    def handshake(original, self, stream, spec, frame_stack):  # type: ignore[no-untyped-def]
        ok = original(self, stream, spec, frame_stack)
        hello = pb.Hello(protocol_version=1, actor_id="x", run_id=uuid.uuid4().hex, num_envs=1)
        stream.write(pb.ActorMessage(hello=hello).SerializeToString())
        return ok

    _wrap(Actor, "_handshake", handshake)


def skip_getinfo() -> None:
    real_stub = actor_module.pb_grpc.LearnerStub
    cached: list[pb.LearnerInfo] = []

    def stub(channel: grpc.Channel) -> object:
        made = real_stub(channel)
        ask = made.GetInfo

        def get_info(*args: object, **kwargs: object) -> pb.LearnerInfo:
            if not cached:  # the one GetInfo; every reconnect reuses its answer
                cached.append(ask(*args, **kwargs))
            return cached[0]

        made.GetInfo = get_info
        return made

    actor_module.pb_grpc.LearnerStub = stub  # type: ignore[attr-defined]


def agents_reversed() -> None:
    def ensure(original, self, info):  # type: ignore[no-untyped-def]
        spec = pb.EnvSpec()
        spec.CopyFrom(original(self, info))
        spec.agents[:] = list(spec.agents)[::-1]
        return spec

    _wrap(Actor, "_ensure_envs", ensure)


def acting_shifted() -> None:
    def frame(original, self, *args):  # type: ignore[no-untyped-def]
        real = self.acting
        self.acting = None if real is None else np.roll(real, 1)
        try:
            return original(self, *args)
        finally:
            self.acting = real

    _wrap(StepWire, "frame", frame)


def agent_actions_rolled() -> None:
    def step(original, self, actions):  # type: ignore[no-untyped-def]
        return original(self, np.roll(actions, -1))

    _wrap(AgentEnvs, "step", step)


def end_flags_kept() -> None:
    def wait(original, self, row):  # type: ignore[no-untyped-def]
        kept = self.terminated[row], self.truncated[row]
        original(self, row)
        self.terminated[row], self.truncated[row] = kept

    _wrap(AgentEnvs, "_wait", wait)


def exit_on_restart() -> list[str]:
    return ["--exit-on-shutdown"]


def late_half_close() -> None:
    def done_writing(original, self):  # type: ignore[no-untyped-def]
        time.sleep(3.5)
        return original(self)

    _wrap(LockstepStream, "done_writing", done_writing)


def ignore_final() -> None:
    def actions(original, self, data):  # type: ignore[no-untyped-def]
        got = original(self, data)
        if isinstance(got, pb.Shutdown):
            got.final = False
        return got

    _wrap(StepWire, "actions", actions)


def no_retry() -> None:
    actor_module.RETRYABLE = frozenset()  # type: ignore[attr-defined]


def no_retry_unavailable() -> None:
    actor_module.RETRYABLE = actor_module.RETRYABLE - {grpc.StatusCode.UNAVAILABLE}  # type: ignore[attr-defined]


def no_retry_exhausted() -> None:
    actor_module.RETRYABLE = actor_module.RETRYABLE - {grpc.StatusCode.RESOURCE_EXHAUSTED}  # type: ignore[attr-defined]


def retry_everything() -> None:
    actor_module.RETRYABLE = frozenset(grpc.StatusCode)  # type: ignore[attr-defined]


def no_jitter() -> None:
    Backoff.next_delay = lambda self: min(self.cap, self.initial * 2 ** _bump(self))  # type: ignore[method-assign]


def no_cap() -> None:
    Backoff.next_delay = lambda self: self.initial * 2 ** _bump(self)  # type: ignore[method-assign]


def no_backoff() -> None:
    Backoff.next_delay = lambda self: 0.0  # type: ignore[method-assign]


def _bump(backoff: Backoff) -> int:
    backoff.attempt += 1
    return backoff.attempt - 1


BREAKS: dict[str, Callable[[], list[str] | None]] = {
    "reuse-run-id": reuse_run_id,
    "reset-reward": reset_reward,
    "swap-actions": swap_actions,
    "truncation-as-termination": truncation_as_termination,
    "reward-after-reset": reward_after_reset,
    "leaves-reversed": leaves_reversed,
    "k-changes": k_changes,
    "float64-rewards": float64_rewards,
    "nan-observation": nan_observation,
    "no-clip": no_clip,
    "stack-unoffered": stack_unoffered,
    "wrong-stack": wrong_stack,
    "no-auth": no_auth,
    "wrong-kwargs": wrong_kwargs,
    "wrong-version": wrong_version,
    "second-hello": second_hello,
    "skip-getinfo": skip_getinfo,
    "late-half-close": late_half_close,
    "ignore-final": ignore_final,
    "agents-reversed": agents_reversed,
    "acting-shifted": acting_shifted,
    "agent-actions-rolled": agent_actions_rolled,
    "end-flags-kept": end_flags_kept,
    "exit-on-restart": exit_on_restart,
    "no-retry": no_retry,
    "no-retry-unavailable": no_retry_unavailable,
    "no-retry-exhausted": no_retry_exhausted,
    "retry-everything": retry_everything,
    "no-jitter": no_jitter,
    "no-cap": no_cap,
    "no-backoff": no_backoff,
}


if __name__ == "__main__":
    extra = BREAKS[sys.argv[1]]() or []
    sys.exit(process.main([*sys.argv[2:], *extra]))
