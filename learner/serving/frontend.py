"""A serving-tier frontend process: the learner's gRPC server with its frames in the slot table.

The model process spawns N of these (``--serving-processes``). Each builds the same
``grpc.aio`` server as a one-process learner (interceptors, auth, TLS, health,
reflection) from the resolved config, binds the learner's port with ``SO_REUSEPORT`` so
the kernel spreads connections over the frontends, and runs the unchanged
:class:`~learner.serving.servicer.LearnerServicer`: every stream rule (admission, Hello,
timeouts, decode and layout checks, INVALID_ARGUMENT, Shutdown) holds here as it does in
one process. Only what the servicer submits to changes: a :class:`SlotSubmitter` writes
the frame into the stream's rows and awaits the reply the model writes back.

The frontend ends with the model process: on EOF of its control pipe, and by
``PR_SET_PDEATHSIG`` should the model die without closing it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from learner.serving.admission import Admission
from learner.serving.batcher import BatcherClosed
from learner.serving.frontend_stats import StreamBlocks
from learner.serving.server import build_server, raise_open_file_limit, set_serving
from learner.serving.servicer import LearnerServicer, NoRoom
from learner.serving.slots import OK, PROCESS_NAME, REJECTED, SlotTable, TableSpec, drain, ring
from learner.serving.streams import Connection, FramePayload
from learner.serving.tier_unrolls import FrontendTrajectories, FrontendUnrolls
from learner.state.stats import LearnerStats
from seedrl import codec
from seedrl.config import LearnerConfig
from seedrl.proto import seedrl_pb2 as pb

log = logging.getLogger(__name__)

TOKEN_ENV = "SEEDRL_FRONTEND_AUTH_TOKEN"
"""Where a frontend finds the learner's resolved token: the environment it was spawned
with, never its argv or a file."""
PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
LEASE_TIMEOUT_S = 30.0
STOP_TASKS_S = 2.0
"""How long a stopping frontend waits for the tasks its stopped server left to end."""


class TableFull(NoRoom):
    """The model process has no lane or rows left for another stream."""


class Lease:
    """One stream's lane and rows, as this frontend writes and reads them."""

    __slots__ = (
        "acting",
        "action_KA",
        "lane",
        "obs",
        "reward",
        "row_bytes",
        "rows",
        "seq",
        "slots",
        "terminated",
        "truncated",
    )

    def __init__(self, table: SlotTable, lane: int, begin: int, count: int) -> None:
        self.lane = lane
        self.obs, self.reward, self.terminated, self.truncated = table.row_views(begin, count)
        self.acting = table.acting_view(begin, count)
        self.row_bytes = len(self.obs)
        self.action_KA = table.action_RA[begin : begin + count]
        self.rows = np.arange(begin, begin + count, dtype=np.int64)
        self.seq = int(table.req_L[lane])
        """The lane's last request; the model answered it once ``rep_L[lane]`` equals it."""
        self.slots: np.ndarray | None = None
        """Its envs' slots in this frontend's trajectory builder."""


class SlotSubmitter:
    """What the servicer submits to in a frontend: it stands where the dynamic batcher,
    the inference engine's release and the trajectory builder's allocation stand in one
    process, and reaches the model through the table (per frame) and the control pipe
    (per stream)."""

    def __init__(
        self,
        table: SlotTable,
        model_bell: int,
        own_bell: int,
        control: Any,
        trajectories: FrontendTrajectories | None = None,
    ) -> None:
        self.table = table
        self.trajectories = trajectories
        """This frontend's builder of its streams' unrolls (None: the model builds them)."""
        self.model_bell = model_bell
        self.own_bell = own_bell
        self.control = control
        self._leases: dict[int, Lease] = {}
        """First table row of each live lease -> the lease."""
        self._by_conn: dict[Connection, Lease] = {}
        self._waiting: dict[int, tuple[Lease, asyncio.Future[int]]] = {}
        self._ring_due = False
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.stray: list[Any] = []
        """Control messages that arrived while a lease was awaited, for the reader."""

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        loop.add_reader(self.own_bell, self._answered)

    # -- the builder's part: a new stream's rows (per stream, a round trip to the model)

    def allocate(self, count: int) -> np.ndarray:
        self.control.send(("allocate", count))
        while True:
            message = _recv(self.control)
            if message[0] == "lease":
                break
            self.stray.append(message)
        _, lane, begin, problem = message
        if problem:
            raise TableFull(problem)
        lease = Lease(self.table, lane, begin, count)
        if self.trajectories is not None:
            lease.slots = self.trajectories.open(count)
        self._leases[begin] = lease
        return np.arange(begin, begin + count, dtype=np.int64)

    # -- the engine's part: a closed stream's lease goes back

    def release_later(self, conn: Connection) -> None:
        lease = self._by_conn.pop(conn, None) or self._leases.get(int(conn.slot_ids[0]))
        if lease is None:
            return
        self._leases.pop(int(conn.slot_ids[0]), None)
        self._waiting.pop(lease.lane, None)
        if self.trajectories is not None and lease.slots is not None:
            self.trajectories.close(lease.slots)
        with contextlib.suppress(OSError):  # the model is gone: nothing to give back to
            self.control.send(("release", lease.lane))

    # -- the batcher's part: a frame in, its actions out

    def set_open_streams(self, count: int) -> None:
        """The model counts open streams from its leases."""

    async def submit(self, payload: FramePayload, num_frames: int) -> np.ndarray:
        if self._closed:
            raise BatcherClosed
        if self.trajectories is not None and self.trajectories.backlog:
            # The trainer is behind: no new frames until it takes, or until the run ends.
            await self.trajectories.room(lambda: self._closed)
            if self._closed:
                raise BatcherClosed
        conn = payload.conn
        lease = self._by_conn.get(conn)
        if lease is None:
            lease = self._by_conn[conn] = self._leases[int(conn.slot_ids[0])]
        obs = payload.observations
        if len(obs) != lease.row_bytes:
            raise codec.WireError(
                f"observations: {len(obs)} bytes where {num_frames} envs take {lease.row_bytes}"
            )
        lease.obs[:] = obs
        lease.reward[:] = payload.rewards
        lease.terminated[:] = payload.terminated
        lease.truncated[:] = payload.truncated
        if payload.acting is not None:  # a multi-agent env's: which of its rows act
            lease.acting[:] = payload.acting
        lease.seq += 1
        self.table.req_L[lease.lane] = lease.seq  # last: the rows are whole once it moves
        assert self._loop is not None
        future: asyncio.Future[int] = self._loop.create_future()
        self._waiting[lease.lane] = (lease, future)
        if not self._ring_due:  # one ring per event-loop pass, however many frames
            self._ring_due = True
            self._loop.call_soon(self._ring_model)
        status = await future
        if status == OK:
            conn.frames += num_frames  # the silent-stream check counts answered frames
            return lease.action_KA.copy()
        if status in REJECTED:
            raise codec.WireError(REJECTED[status])
        raise RuntimeError("the learner's inference batch failed")

    def _ring_model(self) -> None:
        self._ring_due = False
        ring(self.model_bell)

    def _answered(self) -> None:
        """The model rang: resolve every waiting stream whose lane it answered."""
        drain(self.own_bell)
        rep_L, status_L = self.table.rep_L, self.table.status_L
        done = [lane for lane, (lease, _) in self._waiting.items() if rep_L[lane] == lease.seq]
        if self.trajectories is not None and done:
            self._record([self._waiting[lane][0] for lane in done if status_L[lane] == OK])
        for lane in done:
            _, future = self._waiting.pop(lane)
            if not future.done():
                future.set_result(int(status_L[lane]))

    def _record(self, leases: list[Lease]) -> None:
        """The answered rows of every lane of this pass into the builder, in one call,
        before any stream can write its next frame over them."""
        if not leases:
            return
        assert self.trajectories is not None
        slot_B = np.concatenate([lease.slots for lease in leases])
        row_B = np.concatenate([lease.rows for lease in leases])
        self.trajectories.record(slot_B, row_B)

    def close(self) -> None:
        """No more frames: waiting and later submits raise BatcherClosed."""
        self._closed = True
        for _, future in self._waiting.values():
            if not future.done():
                future.set_exception(BatcherClosed())
        self._waiting.clear()


def _recv(control: Any, timeout_s: float = LEASE_TIMEOUT_S) -> Any:
    """The next control message, waited for here: the event loop's reader made the pipe
    non-blocking, and a lease is answered between the model's batches."""
    while control.poll(timeout_s):
        with contextlib.suppress(BlockingIOError):
            return control.recv()
    raise TableFull(f"the learner gave no lease within {timeout_s:g} s")


def frontend_main(
    index: int,
    config: LearnerConfig,
    env_spec: bytes,
    learner_run_id: str,
    spec: TableSpec,
    table_name: str,
    model_bell: int,
    own_bell: int,
    control: Any,
    blocks: StreamBlocks,
    unrolls: FrontendUnrolls | None = None,
    local_addresses: Sequence[str] = (),
    rank_addresses: Sequence[str] = (),
) -> None:
    """The frontend process's entry (multiprocessing spawn): serve until the model says
    stop or goes away; ``local_addresses`` are the tier's same-host sockets, its own
    first (the one it listens on), offered to same-host actors in turn;
    ``rank_addresses`` every torchrun rank's, offered in GetInfo (empty: one rank)."""
    with contextlib.suppress(OSError, AttributeError):  # Linux
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)  # end with the model process
        libc.prctl(PR_SET_NAME, f"{PROCESS_NAME}{index}".encode()[:15])  # for ps and the benchmarks
    logging.basicConfig(
        level=os.environ.get("SEEDRL_LOG_LEVEL", "WARNING"),
        format=f"%(asctime)s %(levelname)s frontend {index} %(name)s: %(message)s",
    )
    from seedrl.transport import run_event_loop

    token = os.environ.pop(TOKEN_ENV, "") or None
    # The blocks outlive the loop: none must be unmapped under a view still alive.
    _blocks = run_event_loop(
        _serve(config, pb.EnvSpec.FromString(env_spec), learner_run_id, spec, table_name,
               model_bell, own_bell, control, token, blocks.open(config, index), unrolls,
               local_addresses, rank_addresses,
               index == 0 or not config.bind.startswith("unix:")),  # one holds a unix path
        config.uvloop,
    )  # fmt: skip
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # with the table still referenced: the process's end unmaps it


async def _serve(
    config: LearnerConfig,
    env_spec: pb.EnvSpec,
    learner_run_id: str,
    spec: TableSpec,
    table_name: str,
    model_bell: int,
    own_bell: int,
    control: Any,
    token: str | None,
    shared: tuple[Admission, LearnerStats, Any],
    unrolls: FrontendUnrolls | None = None,
    local_addresses: Sequence[str] = (),
    rank_addresses: Sequence[str] = (),
    on_bind: bool = True,
) -> tuple[SlotTable, Any, FrontendTrajectories | None]:
    """Serve until told to stop; the table, ``shared`` (admission, stats and their
    blocks) and the unroll buffers, for the caller to keep until the process ends."""
    raise_open_file_limit()
    table = SlotTable(spec, table_name)
    trajectories = None if unrolls is None else unrolls.attach(table)
    submitter = SlotSubmitter(table, model_bell, own_bell, control, trajectories)
    admission, stats, _blocks = shared  # the limits and counters every frontend shares
    # The submitter stands in for the batcher, the engine's release and the builder's slots.
    servicer = LearnerServicer(
        config, env_spec, submitter, submitter, submitter, stats, learner_run_id,
        admission=admission, local_addresses=local_addresses, rank_addresses=rank_addresses,
    )  # fmt: skip
    own = local_addresses[0] if local_addresses else None
    if own == config.bind:  # frontend 0 on a unix --bind: the path is its own socket
        own = None
    server, port, health = build_server(
        config, servicer, token, own, reuse_port=True, on_bind=on_bind
    )
    loop = asyncio.get_running_loop()
    submitter.bind(loop)
    await server.start()
    await set_serving(health, True)
    control.send(("ready", port))
    stop: asyncio.Future[tuple[str, bool]] = loop.create_future()

    def on_control() -> None:
        try:
            messages = [*submitter.stray]
            submitter.stray.clear()
            while control.poll():
                messages.append(control.recv())
        except (EOFError, OSError):  # the model process is gone
            messages.append(("stop", "learner stopping", False))
            loop.remove_reader(control.fileno())
        for message in messages:
            if message[0] == "stop" and not stop.done():
                stop.set_result((message[1], message[2]))

    loop.add_reader(control.fileno(), on_control)
    reason, final = await stop
    await set_serving(health, False)
    servicer.begin_shutdown(reason, final)
    await server.stop(grace=3.0)
    # An RPC's own task may still be sending its status when the server has stopped; let
    # such tasks end rather than be cancelled with the loop, which gRPC logs as an error.
    others = asyncio.all_tasks() - {asyncio.current_task()}
    if others:
        await asyncio.wait(others, timeout=STOP_TASKS_S)
    with contextlib.suppress(Exception):
        loop.remove_reader(control.fileno())
        loop.remove_reader(own_bell)
    return table, shared, trajectories
