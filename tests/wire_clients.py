"""Hand-made gRPC clients for fault, bad-input and security tests.

``act`` plays one scripted Act stream and reports how it ended; ``LockstepClient`` is a
well-behaved actor in a thread that counts the actions it gets, so a test can check
it keeps being served while something else misbehaves. Both use the synchronous grpc
API (thread-safe, no event loop in the test process). Every call has a deadline.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import queue
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from seedrl import PROTOCOL_VERSION, codec
from seedrl.proto import seedrl_pb2 as pb
from seedrl.proto import seedrl_pb2_grpc as pb_grpc
from seedrl.transport import auth_metadata

Metadata = Sequence[tuple[str, str]]


def stub(channel: grpc.Channel) -> pb_grpc.LearnerStub:
    return pb_grpc.LearnerStub(channel)


def get_info(channel: grpc.Channel, metadata: Metadata = ()) -> pb.LearnerInfo:
    return stub(channel).GetInfo(pb.GetInfoRequest(), metadata=metadata, timeout=10)


def hello(env: pb.EnvSpec, num_envs: int, **overrides: object) -> pb.ActorMessage:
    """A Hello that the learner accepts, unless ``overrides`` change some field."""
    fields: dict[str, object] = {
        "protocol_version": PROTOCOL_VERSION,
        "actor_id": "test-client",
        "run_id": uuid.uuid4().hex,
        "num_envs": num_envs,
        "env": env,
    }
    fields.update(overrides)
    return pb.ActorMessage(hello=pb.Hello(**fields))


def frame(
    num_envs: int,
    obs: np.ndarray | None = None,
    reward: np.ndarray | None = None,
    terminated: np.ndarray | None = None,
    truncated: np.ndarray | None = None,
    obs_dim: int = 4,
) -> pb.ActorMessage:
    """A CartPole-shaped Frame; pass any array to make it wrong in that one place."""
    message = pb.ActorMessage()
    f = message.frame
    rng = np.random.default_rng(0)
    default_obs = rng.uniform(-0.05, 0.05, (num_envs, obs_dim)).astype(np.float32)
    codec.encode_tensor(default_obs if obs is None else obs, f.observations)
    codec.encode_tensor(np.ones(num_envs, np.float32) if reward is None else reward, f.rewards)
    no = np.zeros(num_envs, np.bool_)
    codec.encode_tensor(no if terminated is None else terminated, f.terminated)
    codec.encode_tensor(no if truncated is None else truncated, f.truncated)
    return message


@dataclass
class Outcome:
    """How a scripted stream ended."""

    code: grpc.StatusCode
    details: str
    replies: list[pb.LearnerMessage] = field(default_factory=list)


def act(
    channel: grpc.Channel,
    messages: Sequence[pb.ActorMessage],
    metadata: Metadata = (),
    timeout: float = 15.0,
) -> Outcome:
    """Send ``messages`` on one Act stream, read every reply, return the final status."""
    replies: list[pb.LearnerMessage] = []
    call = stub(channel).Act(iter(messages), metadata=metadata, timeout=timeout)
    try:
        for reply in call:
            replies.append(reply)
    except grpc.RpcError as exc:
        return Outcome(exc.code(), exc.details() or "", replies)
    return Outcome(grpc.StatusCode.OK, "", replies)


class LockstepClient:
    """A well-behaved actor in a thread: Hello, then one frame per received reply."""

    def __init__(
        self,
        channel: grpc.Channel,
        env: pb.EnvSpec,
        num_envs: int = 2,
        token: str | None = None,
        pause_s: float = 0.0,
    ) -> None:
        self._stub = stub(channel)
        self._pause_s = pause_s
        self._hello = hello(env, num_envs, actor_id="lockstep-client")
        self._frame = frame(num_envs)
        self._metadata = auth_metadata(token)
        self._requests: queue.Queue[pb.ActorMessage | None] = queue.Queue()
        self._stop = threading.Event()
        self._progress = threading.Condition()
        self.replies = 0
        self.error: BaseException | None = None
        self.ended_by: str | None = None
        self._call: grpc.Future | None = None
        self._thread = threading.Thread(target=self._run, name="lockstep-client", daemon=True)

    def _messages(self) -> Iterator[pb.ActorMessage]:
        while (message := self._requests.get()) is not None:
            yield message

    def _run(self) -> None:
        call = self._stub.Act(self._messages(), metadata=self._metadata, timeout=600)
        self._call = call
        self._requests.put(self._hello)
        try:
            first = next(call)
            if first.WhichOneof("kind") != "accept":
                self.ended_by = f"no accept: {first}"
                return
            while not self._stop.is_set():
                if self._pause_s and self._stop.wait(self._pause_s):
                    break
                self._requests.put(self._frame)
                reply = next(call)
                if reply.WhichOneof("kind") != "actions":
                    self.ended_by = reply.WhichOneof("kind")
                    return
                with self._progress:
                    self.replies += 1
                    self._progress.notify_all()
        except StopIteration:
            self.ended_by = "stream closed"
        except grpc.RpcError as exc:
            if not self._stop.is_set():
                self.error = exc
        finally:
            self._requests.put(None)
            with self._progress:
                self._progress.notify_all()

    def start(self) -> LockstepClient:
        self._thread.start()
        return self

    def wait_for_more(self, count: int, timeout: float = 30.0) -> None:
        """Block until ``count`` more replies arrived; fail if the stream broke or stalled."""
        deadline = time.monotonic() + timeout
        with self._progress:
            target = self.replies + count
            while self.replies < target:
                assert self.error is None, f"good client's stream failed: {self.error}"
                assert self.ended_by is None, f"good client's stream ended: {self.ended_by}"
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"good client stalled at {self.replies} replies"
                self._progress.wait(min(remaining, 0.5))

    def stop(self) -> None:
        self._stop.set()
        if self._call is not None:
            self._call.cancel()
        self._thread.join(timeout=10)


@contextlib.contextmanager
def lockstep(
    channel: grpc.Channel, env: pb.EnvSpec, num_envs: int = 2, token: str | None = None
) -> Iterator[LockstepClient]:
    client = LockstepClient(channel, env, num_envs, token).start()
    try:
        client.wait_for_more(3)
        yield client
    finally:
        client.stop()


class HeldStream:
    """An admitted Act stream that sends its Hello (and ``frames`` frames, each after the
    previous reply), gets the Accept (and the actions), then sends nothing."""

    def __init__(
        self,
        channel: grpc.Channel,
        env: pb.EnvSpec,
        num_envs: int = 2,
        frames: int = 0,
        actor_id: str = "held-stream",
    ) -> None:
        self._release = threading.Event()
        self._requests: queue.Queue[pb.ActorMessage] = queue.Queue()
        self._requests.put(hello(env, num_envs, actor_id=actor_id))
        self.call = stub(channel).Act(self._messages(), timeout=600)
        first = next(self.call)
        assert first.WhichOneof("kind") == "accept", first
        for _ in range(frames):
            self._requests.put(frame(num_envs))
            reply = next(self.call)
            assert reply.WhichOneof("kind") == "actions", reply
        self.last_reply_at = time.monotonic()

    def _messages(self) -> Iterator[pb.ActorMessage]:
        while not self._release.is_set():
            with contextlib.suppress(queue.Empty):
                yield self._requests.get(timeout=0.1)

    def status(self, timeout: float) -> tuple[grpc.StatusCode, str]:
        """How the stream ended (waiting at most ``timeout`` s for the learner to end it)."""
        try:
            self.call.exception(timeout)
        except grpc.FutureTimeoutError:
            raise AssertionError(f"the held stream was not ended within {timeout} s") from None
        return self.call.code(), self.call.details() or ""

    def close(self) -> None:
        self._release.set()
        self.call.cancel()


def child_pids(parent: int) -> list[int]:
    """Live child processes of ``parent`` (Linux /proc)."""
    children = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name may contain spaces; the fields after its ")" are fixed.
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == parent and fields[0] != "Z":
            children.append(int(entry.name))
    return sorted(children)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    with contextlib.suppress(OSError):
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return False


class FakeLearner(pb_grpc.LearnerServicer):
    """Whoever answers at the learner's address: names any env in GetInfo, accepts the
    Hello and says training is over at the first frame."""

    def __init__(self) -> None:
        self.env = pb.EnvSpec()
        self.hellos: list[str] = []

    def GetInfo(self, request: pb.GetInfoRequest, context: Any) -> pb.LearnerInfo:
        return pb.LearnerInfo(protocol_version=PROTOCOL_VERSION, env=self.env)

    def Act(self, request_iterator: Any, context: Any) -> Iterator[pb.LearnerMessage]:
        for message in request_iterator:
            if message.WhichOneof("kind") == "hello":
                self.hellos.append(message.hello.env.env_id)
                yield pb.LearnerMessage(accept=pb.Accept(learner_run_id="fake"))
            else:
                yield pb.LearnerMessage(shutdown=pb.Shutdown(reason="done", final=True))
                return


@contextlib.contextmanager
def fake_learner() -> Iterator[tuple[FakeLearner, int]]:
    """A :class:`FakeLearner` served on a free loopback port, stopped on exit."""
    fake = FakeLearner()
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(4))
    pb_grpc.add_LearnerServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield fake, port
    finally:
        server.stop(0)
