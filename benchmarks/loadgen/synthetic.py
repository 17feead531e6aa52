"""Synthetic actors: the real protocol over real streams, replaying frames made once.

A :class:`Tape` steps the env once, with random actions, through the same vector env an
actor builds (same wrappers, NEXT_STEP autoreset), and keeps what an actor would have
sent: each step's observation (only its newest frame where the learner takes frames
once), reward and episode-end flags, so episodes end at the rate that env really ends
them. :class:`SyntheticActors` then opens S ``Act`` streams of K envs over C
connections in this process, one :class:`StreamDriver` thread per connection: a Hello
like an actor's, then the lockstep loop of one frame (joined from the tape by the
learner's own templates) and one reply, timing each round trip. Env k of a stream
replays the tape from its own offset, so the K envs of a frame and the streams differ.
Stepping no env and waking once per reply, one process holds many streams cheaply.

Streams open a window at a time and, once accepted, send no frame until :meth:`release`:
grpc core keeps a bounded backlog of calls its server has not yet taken up (past it
calls are refused, and one left waiting too long is cancelled), and a server busy answering the
streams already running takes new ones up slowly, so thousands of streams opened at
once against a loaded learner end CANCELLED before their Hello is read.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
from grpc._cython import cygrpc

from seedrl import PROTOCOL_VERSION, codec, envs
from seedrl.proto import seedrl_pb2 as pb
from seedrl.transport import ACT_METHOD, channel_options

RTT_CAPACITY = 1 << 16
"""Round trips kept per connection and window for the percentiles (a ring: the latest)."""
_NO_FLAGS = 0
_RECEIVE_MESSAGE = cygrpc.OperationType.receive_message
_RECEIVE_STATUS = cygrpc.OperationType.receive_status_on_client
_OPERATION_COMPLETE = cygrpc.CompletionType.operation_complete
OPENING_BATCHES = 4
"""Operation batches a stream starts with: metadata out, metadata in, status, Hello."""
WAKER_METHOD = b"/grpc.health.v1.Health/Watch"
"""A call each driver keeps open until :meth:`SyntheticActors.release`, which cancels it:
its ending is what wakes a driver whose streams all wait after their Accept."""
OPENING_WINDOW = 512
"""Streams, over all drivers, opened and not yet accepted at once: under grpc core's
backlog of calls its server has not taken up, past which it refuses some."""


@dataclass
class Tape:
    """One env's recorded steps, as the payload bytes of a Frame's four tensors."""

    obs: list[bytes]
    """Per step: the observation's bytes (its newest frame when ``newest_of_stack``)."""
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    newest_of_stack: int
    """D > 1 when the frames carry the newest of D stacked frames (Hello.frame_stack)."""
    obs_dtype: np.dtype
    obs_shape: tuple[int, ...]
    """The shape of one env's observation as it travels."""

    @property
    def steps(self) -> int:
        return len(self.obs)

    @property
    def episodes(self) -> int:
        return int(np.count_nonzero(self.terminated | self.truncated))


def record_tape(info: pb.LearnerInfo, steps: int, seed: int = 0) -> Tape:
    """Step the learner's env ``steps`` times with random actions, as an actor would send it."""
    spec = info.env
    vec = envs.make_vector_env(spec.env_id, json.loads(spec.env_kwargs_json or "{}"), 1)
    obs_shape = codec.spec_shape(spec.observation_space)
    obs_dtype = np.dtype(spec.observation_space.dtype)
    stack = info.frame_stack
    newest = stack > 1 and len(obs_shape) > 1 and obs_shape[0] == stack
    try:
        vec.action_space.seed(seed)
        obs, _ = vec.reset(seed=seed)
        frames: list[bytes] = []
        reward = np.zeros(steps, np.float32)
        terminated = np.zeros(steps, np.bool_)
        truncated = np.zeros(steps, np.bool_)
        for i in range(steps):
            sent = obs[0, -1] if newest else obs[0]
            frames.append(np.ascontiguousarray(sent, obs_dtype).tobytes())
            obs, r, term, trunc, _ = vec.step(vec.action_space.sample())
            if i + 1 < steps:  # a frame carries the previous step's reward and flags
                reward[i + 1], terminated[i + 1], truncated[i + 1] = r[0], term[0], trunc[0]
    finally:
        vec.close()
    return Tape(
        frames, reward, terminated, truncated, stack if newest else 0, obs_dtype,
        obs_shape[1:] if newest else obs_shape,
    )  # fmt: skip


class FrameSource:
    """The frames of one K-env stream: env k replays the tape from its own offset."""

    def __init__(self, tape: Tape, num_envs: int, first_offset: int) -> None:
        layouts = codec.frame_layouts(num_envs, tape.obs_dtype, tape.obs_shape)
        self._template = codec.frame_template(*layouts)
        steps = tape.steps
        stride = max(1, steps // num_envs)
        self._offsets = [(first_offset + j * stride) % steps for j in range(num_envs)]
        # Rewards and flags of every step, K envs each, joined once: a frame only slices.
        index_SK = (np.arange(steps)[:, None] + np.array(self._offsets)[None, :]) % steps
        self._reward = [tape.reward[row].tobytes() for row in index_SK]
        self._terminated = [tape.terminated[row].tobytes() for row in index_SK]
        self._truncated = [tape.truncated[row].tobytes() for row in index_SK]
        self._obs = tape.obs
        self._steps = steps
        self._step = 0

    def next(self) -> bytes:
        """The next frame's serialized ActorMessage."""
        i, steps, obs = self._step, self._steps, self._obs
        self._step = (i + 1) % steps
        if len(self._offsets) == 1:
            observations = obs[(i + self._offsets[0]) % steps]
        else:
            observations = b"".join([obs[(i + o) % steps] for o in self._offsets])
        return self._template.fill(
            (observations, self._reward[i], self._terminated[i], self._truncated[i])
        )


class _Stream:
    """One synthetic actor's stream on a driver's channel."""

    __slots__ = ("accepted", "call", "index", "sent_at", "source", "status_tag")

    def __init__(self, index: int, source: FrameSource) -> None:
        self.index = index
        self.source = source
        self.call: Any = None
        self.accepted = False
        self.sent_at = 0.0
        self.status_tag = ("status", self)


class StreamDriver:
    """Streams over one channel (one connection), all driven from one thread.

    Each stream's send and receive start as one operation batch tagged with the stream,
    and the thread waits on the channel's completion queue for whichever stream's reply
    comes next: one wake-up per reply and no event loop, the cheapest way grpcio offers
    to keep many lockstep streams going (it is what its sync API's channel thread does
    for every call). The layer is grpcio's Cython one, as in :mod:`actors.stream`.
    """

    def __init__(
        self,
        target: str,
        info: pb.LearnerInfo,
        tape: Tape,
        indices: Sequence[int],
        num_envs: int,
        connection: int,
        metadata: tuple[tuple[str, str], ...] = (),
        opening_window: int = OPENING_WINDOW,
        released: threading.Event | None = None,
    ) -> None:
        options = channel_options(info.max_message_bytes or 16 * 1024 * 1024)
        # Distinct channel arguments give distinct connections (equal ones share one).
        self._channel = grpc.insecure_channel(
            target, options=[*options, ("seedrl.loadgen.connection", connection)]
        )
        self._core = self._channel._channel  # grpc._channel.Channel's cygrpc.Channel
        self.info, self.tape, self.num_envs, self.metadata = info, tape, num_envs, metadata
        self.streams = [
            _Stream(i, FrameSource(tape, num_envs, first_offset=i * 7919)) for i in indices
        ]
        act_dtype = np.dtype("int64" if info.env.action_space.kind == "discrete" else "float32")
        act_shape = (num_envs, *codec.spec_shape(info.env.action_space))
        self._reply_size = codec.actions_template(act_dtype, act_shape).size
        self.connected = 0
        self.replies = 0
        """Replies carrying actions since the window opened."""
        self.errors: list[str] = []
        self.rtt_s = np.zeros(RTT_CAPACITY, np.float64)
        self.rtt_count = 0
        self._opening_window = max(1, opening_window)
        self._released = released if released is not None else threading.Event()
        """Set: accepted streams send frames (until then each waits after its Accept)."""
        self._parked: list[_Stream] = []
        self._waker: Any = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loadgen-driver", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def open_window(self) -> None:
        self.replies = self.rtt_count = 0

    def stop(self) -> None:
        """Cancel every stream (which wakes the driver) and wait for their ends."""
        self._stop.set()
        self.wake()
        for stream in self.streams:
            if stream.call is not None:
                stream.call.cancel(cygrpc.StatusCode.cancelled, "load generator stopping")
        self._thread.join(timeout=30)
        if not self._thread.is_alive():  # else closing would wait for its completions
            self._channel.close()

    def wake(self) -> None:
        """End the waker call, so the driver looks at its parked streams (and its stop)."""
        waker = self._waker
        if waker is not None:
            waker.cancel(cygrpc.StatusCode.cancelled, "load generator released its streams")

    def _open_waker(self) -> int:
        """Open the waker call (a health watch that streams nothing we read): its
        completions to come."""
        operations = (
            (
                (
                    cygrpc.SendInitialMetadataOperation(self.metadata, _NO_FLAGS),
                    cygrpc.SendMessageOperation(b"", _NO_FLAGS),
                    cygrpc.SendCloseFromClientOperation(_NO_FLAGS),
                ),
                None,
            ),
            ((cygrpc.ReceiveStatusOnClientOperation(_NO_FLAGS),), ("waker", None)),
        )
        self._waker = self._core.integrated_call(
            0, WAKER_METHOD, None, None, self.metadata, None, operations, None, None
        )
        return len(operations)

    def _open(self, stream: _Stream) -> None:
        hello = pb.ActorMessage(
            hello=pb.Hello(
                protocol_version=PROTOCOL_VERSION, actor_id=f"loadgen-{stream.index}",
                run_id=uuid.uuid4().hex, num_envs=self.num_envs, env=self.info.env,
                frame_stack=self.tape.newest_of_stack,
            )
        ).SerializeToString()  # fmt: skip
        operations = (
            ((cygrpc.SendInitialMetadataOperation(self.metadata, _NO_FLAGS),), None),
            ((cygrpc.ReceiveInitialMetadataOperation(_NO_FLAGS),), None),
            ((cygrpc.ReceiveStatusOnClientOperation(_NO_FLAGS),), stream.status_tag),
            (
                (
                    cygrpc.SendMessageOperation(hello, _NO_FLAGS),
                    cygrpc.ReceiveMessageOperation(_NO_FLAGS),
                ),
                stream,
            ),
        )
        stream.call = self._core.integrated_call(
            0, ACT_METHOD.encode(), None, None, self.metadata, None, operations, None, None
        )

    def _run(self) -> None:
        unopened = list(reversed(self.streams))
        opening = 0  # opened, neither accepted nor ended
        # Every operation batch started must be taken off the queue before the channel
        # can close: gRPC frees a call only once all of its completions were consumed.
        pending = 0 if self._released.is_set() else self._open_waker()
        if self._stop.is_set() or self._released.is_set():  # before the waker existed
            self.wake()
        next_event, clock = self._core.next_call_event, time.perf_counter
        rtt, mask, reply_size = self.rtt_s, RTT_CAPACITY - 1, self._reply_size
        cancelled = False
        while pending or (unopened and not cancelled):
            cancelled = cancelled or self._stop.is_set()
            while unopened and opening < self._opening_window and not cancelled:
                self._open(unopened.pop())
                opening += 1
                pending += OPENING_BATCHES
            if self._parked and self._released.is_set() and not cancelled:
                for parked in self._parked:
                    pending += self._send(parked, clock)
                self._parked.clear()
            event = next_event()
            if event.completion_type != _OPERATION_COMPLETE:
                continue  # the queue's periodic timeout
            pending -= 1
            tag = event.tag
            if tag is None:  # metadata sent or received
                continue
            if type(tag) is tuple:  # a stream's status: it has ended (or the waker's)
                if tag[1] is None:
                    continue
                opening -= not tag[1].accepted
                if not cancelled:
                    self.errors.append(_status_line(tag[1], event))
                continue
            message = None
            for operation in event.batch_operations:
                if operation.type() == _RECEIVE_MESSAGE:
                    message = operation.message()
            if message is None or cancelled:
                continue  # the stream ended (its status follows) or is being cancelled
            if tag.accepted:
                rtt[self.rtt_count & mask] = clock() - tag.sent_at
                self.rtt_count += 1
                if len(message) != reply_size:  # a Shutdown: the server is stopping
                    continue
                self.replies += 1
            elif pb.LearnerMessage.FromString(message).WhichOneof("kind") == "accept":
                tag.accepted = True
                self.connected += 1
                opening -= 1
                if not self._released.is_set():
                    self._parked.append(tag)
                    continue
            else:
                continue
            pending += self._send(tag, clock)

    @staticmethod
    def _send(stream: _Stream, clock: Any) -> int:
        """Send the stream's next frame and ask for its reply: the completions to come."""
        stream.sent_at = clock()
        started = stream.call.operate(
            (
                cygrpc.SendMessageOperation(stream.source.next(), _NO_FLAGS),
                cygrpc.ReceiveMessageOperation(_NO_FLAGS),
            ),
            stream,
        )
        return int(bool(started))  # False: the call has ended, no completion comes


def _status_line(stream: _Stream, event: Any) -> str:
    for operation in event.batch_operations:
        if operation.type() == _RECEIVE_STATUS:
            details = operation.details()
            if isinstance(details, bytes):
                details = details.decode("utf-8", "replace")
            return f"stream {stream.index} ended: code {operation.code()}: {details}"
    return f"stream {stream.index} ended"


class SyntheticActors:
    """S streams of K envs over ``connections`` connections, one driver thread each.

    ``indices`` numbers the streams (their actor ids and tape offsets) where several
    generator processes split one run's streams; ``opening_window`` is this process's
    share of :data:`OPENING_WINDOW`; connection ``c`` dials ``targets[c % len(targets)]``
    (a serving tier's frontends each offer their own same-host socket)."""

    def __init__(
        self,
        targets: Sequence[str],
        info: pb.LearnerInfo,
        tape: Tape,
        streams: int,
        num_envs: int,
        connections: int,
        metadata: tuple[tuple[str, str], ...] = (),
        indices: Sequence[int] | None = None,
        opening_window: int = OPENING_WINDOW,
    ) -> None:
        numbers = list(range(streams)) if indices is None else list(indices)
        connections = max(1, min(connections, len(numbers)))
        self.num_envs = num_envs
        self.released = threading.Event()
        window = max(1, opening_window // connections)
        self.drivers = [
            StreamDriver(
                targets[c % len(targets)], info, tape, numbers[c::connections], num_envs, c,
                metadata, window, self.released,
            )
            for c in range(connections)
        ]  # fmt: skip

    def start(self) -> None:
        for driver in self.drivers:
            driver.start()

    def release(self) -> None:
        """Accepted streams start sending frames (those accepted later, at once)."""
        self.released.set()
        for driver in self.drivers:
            driver.wake()

    def cpu_seconds(self) -> float:
        """The generator's CPU seconds so far (this process's)."""
        return time.process_time()

    def rtt_samples_s(self) -> np.ndarray:
        """Round trips (s) since the window opened, every driver's."""
        samples = [d.rtt_s[: min(d.rtt_count, RTT_CAPACITY)] for d in self.drivers]
        return np.concatenate(samples) if samples else np.zeros(0)

    @property
    def connected(self) -> int:
        return sum(d.connected for d in self.drivers)

    @property
    def replies(self) -> int:
        return sum(d.replies for d in self.drivers)

    @property
    def errors(self) -> list[str]:
        return [e for d in self.drivers for e in d.errors]

    def open_window(self) -> None:
        """Count replies and round trips from now on."""
        for driver in self.drivers:
            driver.open_window()

    def rtt_percentiles_ms(self) -> tuple[float | None, float | None]:
        """Round-trip p50 and p99 (ms) since the window opened."""
        return percentiles_ms(self.rtt_samples_s())

    def stop(self) -> None:
        for driver in self.drivers:
            driver.stop()


def percentiles_ms(samples_s: np.ndarray) -> tuple[float | None, float | None]:
    """p50 and p99 (ms) of round trips in seconds; None for none."""
    if samples_s.size == 0:
        return None, None
    p50, p99 = np.percentile(samples_s, (50, 99)) * 1e3
    return float(p50), float(p99)
