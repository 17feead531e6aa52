"""The ``seedrl.v1.Learner`` service: admission, per-frame validation, batched actions.

``Act`` admits one actor stream (Hello -> Accept), then for every Frame decodes and
validates the K observations/rewards/flags, submits them to the dynamic batcher and
answers with the K actions. For envs that stack frames (see LearnerConfig.frame_once)
it offers actors to send the newest frame only, and keeps just that frame of actors that
send whole stacks. Anything malformed ends *that* stream with
``INVALID_ARGUMENT`` and a message saying what was wrong; the other streams go on. A
stream that sends no Hello within ``hello_timeout_s``, or no frame for
``stream_idle_timeout_s`` after its last reply, ends with ``DEADLINE_EXCEEDED`` and
frees what it held.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple, Protocol

import grpc
import numpy as np

from learner.serving.admission import Admission
from learner.serving.batcher import BatcherClosed
from learner.serving.interceptors import Undecodable, undecodable_on_error
from learner.serving.streams import Connection, FramePayload
from learner.state.stats import LearnerStats
from learner.state.trajectories import stored_frame_stack
from seedrl import PROTOCOL_VERSION, codec
from seedrl.config import LearnerConfig
from seedrl.proto import seedrl_pb2 as pb
from seedrl.proto import seedrl_pb2_grpc as pb_grpc
from seedrl.transport import ACT_METHOD

log = logging.getLogger(__name__)

MAX_ENVS_PER_ACTOR = 4096
SHUTDOWN_ACK_TIMEOUT_S = 2.0
"""How long a stream that was sent its Shutdown waits for the actor to end its side."""
MAX_IDLE_CHECK_INTERVAL_S = 1.0
"""The silent-stream check runs at a quarter of the bound, at least this often, so a
stream ends at most this long after its bound."""

_parse_actor_message = undecodable_on_error(pb.ActorMessage.FromString)
"""``Act``'s own parse (it takes raw bytes): an ActorMessage, or :class:`Undecodable`."""


class NoRoom(Exception):
    """The slot pool has no room for a stream's rows: refused as the limits refuse."""


class Batches(Protocol):
    """Where frames go for their actions: the dynamic batcher (in a serving-tier frontend,
    the slot table's submitter, :mod:`learner.serving.frontend`)."""

    async def submit(self, payload: FramePayload, num_frames: int) -> Any: ...
    def set_open_streams(self, count: int) -> None: ...
    def close(self) -> None: ...


class SlotPool(Protocol):
    """Where a new stream's envs get their slots (``TrajectoryBuilder``)."""

    def allocate(self, count: int) -> np.ndarray: ...


class StreamEnds(Protocol):
    """Who frees a closed stream's slots (:class:`~learner.serving.inference.InferenceEngine`)."""

    def release_later(self, conn: Connection) -> None: ...


class LearnerServicer(pb_grpc.LearnerServicer):
    """Serves actors: admission, per-frame validation, batched actions, graceful shutdown."""

    def __init__(
        self,
        config: LearnerConfig,
        env_spec: pb.EnvSpec,
        batcher: Batches,
        engine: StreamEnds,
        builder: SlotPool,
        stats: LearnerStats,
        learner_run_id: str | None = None,
        rank_addresses: Sequence[str] = (),
        local_addresses: Sequence[str] = (),
        admission: Admission | None = None,
    ) -> None:
        self.config = config
        self.env_spec = env_spec
        self.batcher = batcher
        self.engine = engine
        self.builder = builder
        self.stats = stats
        self.learner_run_id = learner_run_id or uuid.uuid4().hex
        self.rank_addresses = list(rank_addresses)
        """Every data-parallel rank's address, offered to actors (empty: one rank)."""
        self.local_addresses = list(local_addresses)
        """The unix sockets offered to same-host actors, one per GetInfo in turn: this
        learner's own, or every serving frontend's so that same-host actors spread evenly
        over the frontends whichever one the kernel gave their TCP connection."""
        self._offers = 0
        self.connections: set[Connection] = set()
        self._obs_shape = codec.spec_shape(env_spec.observation_space)
        self._obs_dtype = np.dtype(env_spec.observation_space.dtype or "uint8")
        self._obs_leaves: list[codec.Leaf] = []
        self._packing: codec.LeafPacking | None = None
        if codec.is_structured(env_spec.observation_space):
            self._obs_leaves = codec.space_leaves(env_spec.observation_space)
            self._packing = codec.LeafPacking(self._obs_leaves)
        self.agents = codec.rows_per_env(env_spec) if env_spec.agents else 0
        """A multi-agent env's agents per env (each a row of every frame); 0 for one agent."""
        self.frame_stack = stored_frame_stack(config, env_spec.observation_space)
        """D > 1: streams may send the newest frame only, and only it is kept of any."""
        self._frame_layouts: dict[tuple[int, bool], FrameLayout] = {}
        self._reply_wires: dict[tuple[np.dtype, tuple[int, ...]], codec.WireTemplate] = {}
        self._shutdown: pb.Shutdown | None = None
        self._watches: dict[Connection, StreamWatch] = {}
        self._idle_check: asyncio.Task[None] | None = None
        self.admission = admission if admission is not None else Admission(config)
        """The stream limits, counted in this process (or, in a serving-tier frontend,
        across every frontend)."""

    # ------------------------------------------------------------------ GetInfo

    async def GetInfo(self, request: pb.GetInfoRequest, context: Any) -> pb.LearnerInfo:
        return pb.LearnerInfo(
            protocol_version=PROTOCOL_VERSION,
            env=self.env_spec,
            learner_run_id=self.learner_run_id,
            max_message_bytes=self.config.max_message_bytes,
            rank_addresses=self.rank_addresses,
            local_address=self._offered_socket(context),
            frame_stack=self.frame_stack if self.frame_stack > 1 else 0,
            envs_per_actor=self.config.actor_envs_per_actor,
        )

    def _offered_socket(self, context: Any) -> str:
        """The next same-host socket in turn (empty: none offered). A call over a unix
        socket while the learner listens on TCP is an actor asking again through the
        socket it took: it takes no turn, or the next actor over TCP would get that one too."""
        if not self.local_addresses:
            return ""
        address = self.local_addresses[self._offers % len(self.local_addresses)]
        peer = context.peer() if context is not None else ""
        if not peer.startswith("unix:") or self.config.bind.startswith("unix:"):
            self._offers += 1
        return address

    # ------------------------------------------------------------------ Act

    async def Act(self, request_iterator: Any, context: Any) -> None:
        """One actor's stream: Hello, Accept, then a Frame -> actions round trip per step.

        Reads and writes with ``context.read``/``context.write`` rather than iterating the
        requests and yielding replies: the async-generator form costs two extra event-loop
        hops per frame. Messages travel as
        bytes (:func:`~seedrl.transport.add_learner_service`): a Frame that matches its
        layout's :class:`~seedrl.codec.WireTemplate` is split by slicing, anything else is
        parsed and checked in full, and replies are joined from a template.
        """
        if self._shutdown is not None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "learner is shutting down")
        await self._check_room(context)  # a place held until the Hello says who it is
        try:
            first = await self._read_hello(context)
        finally:
            self.admission.hello_ended()
        if first is grpc.aio.EOF:
            return
        conn = await self._admit(await self._parse(first, context), context)
        watch = self._watch(conn)
        layout = self.frame_layout(conn.num_envs, conn.newest_frame_only)
        submit, k, keep_newest = self.batcher.submit, conn.num_envs, layout.keep_newest
        make_payload = layout.make_payload or FramePayload
        split: Callable[[bytes], tuple[bytes, ...] | None] = layout.wire.split
        reply_bytes = self.reply_encoder(k)
        phases = self.stats.phases
        if phases is not None:  # --time-phases
            split, reply_bytes = phases.timed("decode", split), phases.timed("reply", reply_bytes)
            if keep_newest is not None:
                keep_newest = phases.timed("decode", keep_newest)
        read, write = context.read, context.write
        try:
            await write(_accept(self.learner_run_id))
            while True:
                raw = await read()
                watch.reads += 1
                if raw is grpc.aio.EOF:
                    return
                payloads = split(raw)
                try:
                    if payloads is not None:
                        payload = make_payload(conn, *payloads)
                    else:
                        payload = await self._parse_frame(conn, layout, raw, context)
                    if keep_newest is not None:
                        payload.observations = keep_newest(payload.observations)
                    actions = await submit(payload, k)
                except codec.WireError as exc:  # from the layout check, or NaN found in the batch
                    await self._invalid(context, f"bad frame: {exc}")
                except BatcherClosed:
                    shutdown = pb.LearnerMessage(shutdown=self._shutdown or _stopping())
                    await write(shutdown.SerializeToString())
                    await _await_actor_end(read)
                    return
                await write(reply_bytes(actions))
        except asyncio.CancelledError:
            if not watch.timed_out:  # the server or the actor cancelled the call
                raise
            await self._end_silent(conn, context)
        finally:
            self._disconnect(conn)

    async def _check_room(self, context: Any) -> None:
        """RESOURCE_EXHAUSTED when admitted streams and those awaiting their Hello already
        fill --max-actors: a stream that never says who it is still takes a place (until
        --hello-timeout-s), so such streams cannot pile up beside the admitted ones."""
        refusal = self.admission.open_stream()
        if refusal is not None:
            await self._refuse(context, refusal)

    async def _refuse(self, context: Any, refusal: str) -> None:
        self.stats.streams_rejected += 1
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refusal)

    async def _invalid(self, context: Any, details: str) -> None:
        """End this stream with INVALID_ARGUMENT (a bad Hello or frame), counted."""
        self.stats.streams_invalid += 1
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, details)

    async def _read_hello(self, context: Any) -> Any:
        """The stream's first message, or DEADLINE_EXCEEDED after ``hello_timeout_s``."""
        bound = self.config.hello_timeout_s
        if not bound:
            return await context.read()
        try:
            async with asyncio.timeout(bound):
                return await context.read()
        except TimeoutError:
            self.stats.streams_timed_out += 1
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"no Hello within {bound:g} s of opening the stream (--hello-timeout-s)",
            )

    def _watch(self, conn: Connection) -> StreamWatch:
        """Put an admitted stream under the silent-stream check (started with the first)."""
        watch = StreamWatch(asyncio.current_task(), asyncio.get_running_loop().time())
        bound = self.config.stream_idle_timeout_s
        if bound:
            self._watches[conn] = watch
            if self._idle_check is None:
                self._idle_check = asyncio.create_task(
                    self._end_silent_streams(bound), name="silent-streams"
                )
        return watch

    async def _end_silent_streams(self, bound: float) -> None:
        """Cancel the handler of every stream whose actor owes a frame for ``bound`` s.

        A stream owes a frame once each frame it sent was answered (``conn.frames``, which
        the engine counts as it answers, equals the frames read); while the learner holds
        a frame (a batch forming, back-pressure) the stream is not silent. Its silence is
        counted from the first sweep that sees it owe a frame with no answer since the
        previous sweep, so it ends at least one bound after its last reply and at most two
        sweeps later. A sweep every quarter bound costs nothing per frame beyond the read
        count.
        """
        loop = asyncio.get_running_loop()
        interval = min(max(bound / 4, 0.05), MAX_IDLE_CHECK_INTERVAL_S)
        while True:
            await asyncio.sleep(interval)
            now = loop.time()
            for conn, watch in self._watches.items():
                frames = conn.frames
                if frames != watch.seen_frames or frames != watch.reads * conn.num_envs:
                    watch.seen_frames, watch.quiet_since = frames, now
                elif now - watch.quiet_since >= bound and not watch.timed_out:
                    watch.timed_out = True
                    if watch.task is not None:
                        watch.task.cancel()

    async def _end_silent(self, conn: Connection, context: Any) -> None:
        """End a stream the silent-stream check cancelled, with DEADLINE_EXCEEDED."""
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()  # the cancel was ours; let abort's own awaits run
        bound = self.config.stream_idle_timeout_s
        self.stats.streams_timed_out += 1
        log.warning(
            "actor %r sent no frame for %g s (--stream-idle-timeout-s): stream ended, its "
            "place and %d env slots freed", conn.actor_id, bound, conn.num_envs,
        )  # fmt: skip
        await context.abort(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"no frame for {bound:g} s after the last reply (--stream-idle-timeout-s); "
            "the stream's place was freed, reconnect with a new run_id",
        )

    async def _parse(self, raw: bytes, context: Any) -> pb.ActorMessage:
        """Parse an ActorMessage, or end the stream with INVALID_ARGUMENT if it does not parse."""
        message = _parse_actor_message(raw)
        if type(message) is Undecodable:
            await self._invalid(context, message.describe(ACT_METHOD))
        return message

    async def _parse_frame(
        self, conn: Connection, layout: FrameLayout, raw: bytes, context: Any
    ) -> FramePayload:
        """The full path for bytes that missed the template: parse, then check every field."""
        message = await self._parse(raw, context)
        if message.WhichOneof("kind") != "frame":
            await self._invalid(context, "only Frame messages may follow the Hello")
        return self.frame_payload(conn, layout, message.frame)

    def reply_encoder(self, num_envs: int) -> Callable[[np.ndarray], bytes]:
        """A K-env stream's reply encoding: actions of the layout the action space gives
        (checked by identity and shape, no lookup) join its template with one ``join``;
        any other layout takes :meth:`reply_bytes`."""
        space = self.env_spec.action_space
        if codec.is_structured(space):  # the head's flat actions, one tensor per leaf
            leaves = codec.space_leaves(space, action=True)
            fill = codec.actions_leaves_template(codec.leaf_layouts(num_envs, leaves)).fill
            return lambda actions: fill(
                [a.tobytes() for a in codec.action_leaves_of(space, actions)]
            )
        dtype, shape = codec.action_dtype(space), (num_envs, *codec.spec_shape(space))
        fill_one, general = codec.actions_template(dtype, shape).fill_one, self.reply_bytes

        def encode(actions: np.ndarray) -> bytes:
            if actions.dtype is dtype and actions.shape == shape:
                return fill_one(actions.tobytes())
            return general(actions)

        return encode

    def reply_bytes(self, actions: np.ndarray) -> bytes:
        """The serialized LearnerMessage carrying these actions (template per dtype and K)."""
        key = (actions.dtype, actions.shape)
        wire = self._reply_wires.get(key)
        if wire is None:
            wire = self._reply_wires[key] = codec.actions_template(actions.dtype, actions.shape)
        return wire.fill((actions.tobytes(),))

    async def _admit(self, message: pb.ActorMessage, context: Any) -> Connection:
        """Check the first message (it must be a Hello) and take a place."""
        if message.WhichOneof("kind") != "hello":
            await self._invalid(context, "the first message must be a Hello")
        hello = message.hello
        problem = self._check_hello(hello)
        if problem:
            await self._invalid(context, problem)
        # A multi-agent env's agents are rows (and slots) of their own: they count here.
        rows = hello.num_envs * max(1, self.agents)
        peer = context.peer()
        refusal = self.admission.admit(peer_host(peer), rows)
        if refusal is not None:
            await self._refuse(context, refusal)
        try:
            # A new stream (and so a new run_id) always gets freshly reset slots.
            slot_ids = self.builder.allocate(rows)
        except BaseException as exc:
            self.admission.leave(peer_host(peer), rows)
            if isinstance(exc, NoRoom):
                await self._refuse(context, f"learner is full: {exc}; retry later")
            raise
        conn = Connection(
            actor_id=hello.actor_id,
            run_id=hello.run_id,
            peer=peer,
            num_envs=rows,
            newest_frame_only=hello.frame_stack > 1,
            slot_ids=slot_ids,
        )
        self.connections.add(conn)
        self.batcher.set_open_streams(len(self.connections))
        self.stats.actors_connected = len(self.connections)
        log.info("actor %r connected from %s with %d envs", conn.actor_id, conn.peer, conn.num_envs)
        return conn

    def _check_hello(self, hello: pb.Hello) -> str | None:
        if hello.protocol_version != PROTOCOL_VERSION:
            return (
                f"protocol version {hello.protocol_version} is not supported; "
                f"this learner speaks version {PROTOCOL_VERSION}"
            )
        if not 1 <= hello.num_envs <= MAX_ENVS_PER_ACTOR:
            return f"num_envs must be in [1, {MAX_ENVS_PER_ACTOR}], got {hello.num_envs}"
        if not hello.run_id:
            return "hello.run_id is empty: every connection needs a fresh random run_id"
        if hello.frame_stack > 1 and hello.frame_stack != self.frame_stack:
            offer = f"{self.frame_stack}-frame stacks" if self.frame_stack > 1 else "no stacks"
            return (
                f"hello.frame_stack {hello.frame_stack}: this learner takes newest frames of "
                f"{offer}; send whole observations (frame_stack 0)"
            )
        mine = self.env_spec
        if hello.env.env_id != mine.env_id:
            return f"actor runs env {hello.env.env_id!r} but this learner trains {mine.env_id!r}"
        if list(hello.env.agents) != list(mine.agents):
            return (
                f"actor's env has agents {list(hello.env.agents)} but the learner's has "
                f"{list(mine.agents)} (in this order)"
            )
        if (mismatch := codec.space_mismatch(hello.env, mine)) is not None:
            name, theirs, ours = mismatch
            return f"actor's {name} {theirs} differs from the learner's {ours}"
        return None

    def frame_layout(self, num_envs: int, newest_frame_only: bool = False) -> FrameLayout:
        """What each field of a K-env Frame must look like (cached per K and kind)."""
        key = (num_envs, newest_frame_only)
        layout = self._frame_layouts.get(key)
        if layout is None and self._packing is not None:
            layout = self._frame_layouts[key] = self._structured_layout(num_envs, self._packing)
        if layout is None:
            shape = self._obs_shape[1:] if newest_frame_only else self._obs_shape
            layouts = codec.frame_layouts(num_envs, self._obs_dtype, shape)
            keep_newest = None
            if self.frame_stack > 1 and not newest_frame_only:
                keep_newest = _newest_frames_of(num_envs, self._obs_dtype, self._obs_shape)
            acting = self._acting_layout(num_envs)
            template = codec.frame_template(*layouts, acting)
            layout = FrameLayout(*layouts, template, keep_newest, None, (), acting)
            self._frame_layouts[key] = layout
        return layout

    def _acting_layout(self, num_rows: int) -> codec.TensorLayout | None:
        """A multi-agent env's acting flags ``[rows]`` bool; None for a single-agent env."""
        return codec.tensor_layout(np.bool_, (num_rows,)) if self.agents else None

    def _structured_layout(self, num_envs: int, packing: codec.LeafPacking) -> FrameLayout:
        """A dict/tuple observation space's Frame: one tensor per leaf, kept as packed rows."""
        rewards, flags = codec.frame_layouts(num_envs, np.float32, ())[1:]
        leaves = codec.leaf_layouts(num_envs, packing.leaves)
        float_leaves = [
            (i, leaf.name, leaf.dtype) for i, leaf in enumerate(packing.leaves)
            if leaf.dtype.kind == "f"
        ]  # fmt: skip
        mask_check = self._mask_check(packing.leaves, num_envs)
        acting_layout = self._acting_layout(num_envs)
        agents = acting_layout is not None

        def make_payload(
            conn: Connection, rewards: bytes, terminated: bytes, truncated: bytes, *obs: bytes
        ) -> FramePayload:
            acting = None
            if agents:  # the acting flags follow the leaves
                *obs, acting = obs  # type: ignore[assignment]
            # Packed rows are bytes to the engine's NaN check, so float leaves are checked here.
            for i, name, dtype in float_leaves:
                if not codec.all_finite(np.frombuffer(obs[i], dtype)):
                    raise codec.WireError(f"observation leaf {name!r}: contains NaN or inf")
            if mask_check is not None:
                mask_check(obs, acting)
            packed = packing.pack(obs, num_envs)
            return FramePayload(conn, packed, rewards, terminated, truncated, acting)

        return FrameLayout(
            observations=codec.tensor_layout(np.uint8, (num_envs, packing.row_bytes)),
            rewards=rewards,
            flags=flags,
            wire=codec.structured_frame_template(leaves, rewards, flags, acting_layout),
            keep_newest=None,
            make_payload=make_payload,
            leaves=tuple(leaves),
            acting=acting_layout,
        )

    def _mask_check(
        self, leaves: Sequence[codec.Leaf], num_envs: int
    ) -> Callable[[Sequence[bytes], bytes | None], None] | None:
        """Where the observation carries the action mask (--action-mask): a check that every
        env (every MultiDiscrete element) allows at least one action; of a multi-agent
        env's rows, only the acting ones (a waiting agent's or a final row's mask may be
        empty: no action of it is ever applied)."""
        action = self.env_spec.action_space
        name = self.config.action_mask
        found = [i for i, leaf in enumerate(leaves) if name and leaf.name == name]
        if not found or action.kind not in ("discrete", "multi_discrete"):
            return None
        index, dtype = found[0], leaves[found[0]].dtype
        nvec = [int(action.n)] if action.kind == "discrete" else [int(n) for n in action.nvec]
        starts = np.cumsum([0, *nvec[:-1]])

        def check(obs: Sequence[bytes], acting: bytes | None = None) -> None:
            allowed_KA = np.frombuffer(obs[index], dtype).reshape(num_envs, -1) != 0
            if acting is not None:
                allowed_KA = allowed_KA[np.frombuffer(acting, np.bool_)]
            if not np.logical_or.reduceat(allowed_KA, starts, axis=1).all():
                raise codec.WireError(
                    f"observation leaf {name!r}: an env's action mask allows no action "
                    "(every choice needs at least one non-zero entry)"
                )

        return check

    def frame_payload(self, conn: Connection, layout: FrameLayout, frame: pb.Frame) -> FramePayload:
        """Check one Frame's four tensors against the stream's layout and keep their bytes.

        Values are checked (NaN, inf) once per batch by the inference engine, which rejects
        only the offending streams.
        """
        if layout.make_payload is not None:
            return self._structured_payload(conn, layout, frame)
        if frame.observation_leaves:
            raise codec.WireError(
                "observation_leaves are for dict/tuple observation spaces; this env's "
                "observations travel in Frame.observations"
            )
        try:
            return FramePayload(
                conn,
                codec.checked_bytes(frame.observations, "observations", layout.observations),
                codec.checked_bytes(frame.rewards, "rewards", layout.rewards),
                codec.checked_bytes(frame.terminated, "terminated", layout.flags),
                codec.checked_bytes(frame.truncated, "truncated", layout.flags),
                _acting_bytes(frame, layout),
            )
        except codec.WireError:
            envs_in_frame = frame.observations.shape[0] if frame.observations.shape else None
            if envs_in_frame != conn.num_envs:
                raise codec.WireError(
                    f"observations carry {envs_in_frame} envs but the Hello declared "
                    f"num_envs={conn.num_envs} (K cannot change mid-stream; open a new stream)"
                ) from None
            raise

    def _structured_payload(
        self, conn: Connection, layout: FrameLayout, frame: pb.Frame
    ) -> FramePayload:
        """The full check of a dict/tuple observation Frame: one tensor per leaf, in order."""
        assert layout.make_payload is not None
        if frame.HasField("observations"):
            raise codec.WireError(
                "observations must be unset for a dict/tuple observation space: send one "
                "tensor per leaf in observation_leaves"
            )
        leaves = self._obs_leaves
        if len(frame.observation_leaves) != len(leaves):
            raise codec.WireError(
                f"observation_leaves: {len(frame.observation_leaves)} tensors but the "
                f"observation space has {len(leaves)} leaves ({[x.name for x in leaves]})"
            )
        obs = []
        for tensor, leaf, expected in zip(
            frame.observation_leaves, leaves, layout.leaves, strict=True
        ):
            envs_in_frame = tensor.shape[0] if tensor.shape else None
            if envs_in_frame != conn.num_envs:
                raise codec.WireError(
                    f"observation leaf {leaf.name!r} carries {envs_in_frame} envs but the Hello "
                    f"declared num_envs={conn.num_envs} (K cannot change mid-stream)"
                )
            obs.append(codec.checked_bytes(tensor, f"observation leaf {leaf.name!r}", expected))
        acting = _acting_bytes(frame, layout)
        return layout.make_payload(
            conn,
            codec.checked_bytes(frame.rewards, "rewards", layout.rewards),
            codec.checked_bytes(frame.terminated, "terminated", layout.flags),
            codec.checked_bytes(frame.truncated, "truncated", layout.flags),
            *obs,
            *(() if acting is None else (acting,)),
        )

    def _disconnect(self, conn: Connection) -> None:
        self._watches.pop(conn, None)
        if conn in self.connections:
            self.connections.discard(conn)
            self.engine.release_later(conn)
            self.admission.leave(peer_host(conn.peer), conn.num_envs)
            self.batcher.set_open_streams(len(self.connections))
            self.stats.actors_connected = len(self.connections)
            log.info("actor %r disconnected after %d frames", conn.actor_id, conn.frames)

    def begin_shutdown(self, reason: str, final: bool) -> None:
        """Stop serving frames: every stream gets a Shutdown message and ends."""
        self._shutdown = pb.Shutdown(reason=reason, final=final)
        self.batcher.close()
        if self._idle_check is not None:
            self._idle_check.cancel()


class StreamWatch:
    """What the silent-stream check knows of one admitted stream's handler."""

    __slots__ = ("quiet_since", "reads", "seen_frames", "task", "timed_out")

    def __init__(self, task: asyncio.Task[Any] | None, now: float) -> None:
        self.task = task
        self.reads = 0
        """Messages the handler has read since the Hello (counted per frame)."""
        self.seen_frames = 0
        """The stream's answered frames at the previous check."""
        self.quiet_since = now
        """Loop time the check first saw the stream owe a frame, answered up to
        ``seen_frames``."""
        self.timed_out = False


class FrameLayout(NamedTuple):
    """A Frame's expected tensor layouts for one K (terminated and truncated share one)."""

    observations: codec.TensorLayout
    rewards: codec.TensorLayout
    flags: codec.TensorLayout
    wire: codec.WireTemplate
    """The canonical bytes of such a Frame, for the no-parse path."""
    keep_newest: Callable[[bytes], bytes] | None
    """Whole stacks -> their newest frames, where the learner keeps only those."""
    make_payload: Callable[..., FramePayload] | None
    """Dict/tuple observations: the template's payloads (rewards, flags, then each leaf)
    -> a FramePayload of packed rows; None for one observation tensor."""
    leaves: tuple[codec.TensorLayout, ...]
    """Dict/tuple observations: each leaf's layout, in wire order."""
    acting: codec.TensorLayout | None = None
    """A multi-agent env's acting flags; None for a single-agent env (the field unset)."""


def _acting_bytes(frame: pb.Frame, layout: FrameLayout) -> bytes | None:
    """The acting flags of a fully parsed Frame: required exactly for a multi-agent env."""
    if layout.acting is None:
        if frame.HasField("acting"):
            raise codec.WireError("acting is for multi-agent envs; this env has one agent")
        return None
    if not frame.HasField("acting"):
        raise codec.WireError(
            "acting is missing: a multi-agent env's frame marks the rows that act (bool [rows])"
        )
    return codec.checked_bytes(frame.acting, "acting", layout.acting)


def _newest_frames_of(
    num_envs: int, dtype: np.dtype, obs_shape: tuple[int, ...]
) -> Callable[[bytes], bytes]:
    def keep_newest(data: bytes) -> bytes:
        return np.frombuffer(data, dtype).reshape(num_envs, *obs_shape)[:, -1].tobytes()

    return keep_newest


async def _await_actor_end(read: Callable[[], Awaitable[Any]]) -> None:
    """Keep a stream open until the actor, having read its Shutdown, ends its side.

    The server closes its connections as soon as its last handler returns. The actors of
    one process share a connection, so a handler that returned right after writing the
    Shutdown could have the socket closed before every stream's Shutdown left it: those
    actors saw UNAVAILABLE ("Stream removed"), took the learner for gone and retried
    forever (4 of 76 runs with 3-4 streams in one process; 0 of 50 since). An actor
    half-closes or cancels only after it has read the message, so waiting for that
    (bounded) makes the stop wait until the actors have heard it.
    """
    with contextlib.suppress(Exception):
        await asyncio.wait_for(read(), SHUTDOWN_ACK_TIMEOUT_S)


def peer_host(peer: str) -> str:
    """The peer a stream's envs are counted against: its address without the port
    (``ipv4:10.0.0.7:51234`` -> ``ipv4:10.0.0.7``); every unix-socket client is one peer,
    ``unix`` (all of them run on the learner's host)."""
    if peer.startswith("unix"):
        return "unix"
    host, sep, _port = peer.rpartition(":")
    return host if sep else peer


def _stopping() -> pb.Shutdown:
    return pb.Shutdown(reason="learner stopping", final=False)


def _accept(learner_run_id: str) -> bytes:
    return pb.LearnerMessage(accept=pb.Accept(learner_run_id=learner_run_id)).SerializeToString()
