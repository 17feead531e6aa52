"""The serving tier's model side: frontends spawned and watched, batches read off the slot table.

With ``--serving-processes N`` the learner process keeps the model and serves no gRPC:
N frontend processes (:mod:`learner.serving.frontend`) share its port and write frames
into the slot table (:mod:`learner.serving.slots`). Here :class:`SlotBatcher` closes a
batch over the table by today's rule (size, quorum of open streams, deadline), gathers
its rows by index and serves them with the engine's serving core
(:mod:`learner.serving.tier_batch`), writes the reply rows, and rings each owning
frontend once per batch. :class:`TierServing` holds the port (lock file and probe bind),
spawns the frontends, reclaims a dead one's leases and restarts it with backoff, and
ends the run when one keeps dying.

The trajectory builder and the episode statistics run in the frontends: here the
engine's builder is :class:`~learner.serving.tier_unrolls.ModelRows` (first flags, frame
stacks, recurrent state, and the reply rows the frontends' builders read), and an
:class:`~learner.serving.tier_unrolls.UnrollDrain` thread moves the frontends' finished
unrolls from their shared-memory rings into the learner's store.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import hashlib
import logging
import math
import multiprocessing as mp
import os
import socket
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from learner.agents.models import UnsupportedSetup
from learner.serving.admission import SharedCounts
from learner.serving.auto import FLAG, frontends, tier_gaps
from learner.serving.batcher import QUORUM_NONE
from learner.serving.frontend import TOKEN_ENV, frontend_main
from learner.serving.frontend_stats import FrontendCounters, StreamBlocks, frontend_metrics
from learner.serving.inference import InferenceEngine
from learner.serving.slots import (
    FAILED,
    InheritedFd,
    RowSpans,
    SlotTable,
    TableSpec,
    drain,
    new_doorbell,
    ring,
)
from learner.serving.streams import Connection
from learner.serving.tier_batch import LaneRows
from learner.serving.tier_unrolls import (
    FrontendUnrolls,
    ModelRows,
    RingSpec,
    UnrollDrain,
    UnrollRing,
    layout_sizes,
    reply_spec,
)
from learner.state.normalize import Normalizer
from learner.state.stats import LearnerStats
from learner.state.trajectories import TrajectoryBuilder
from seedrl.config import LearnerConfig
from seedrl.proto import seedrl_pb2 as pb
from seedrl.transport import frontend_bind_address, frontend_local_address

log = logging.getLogger(__name__)

DEATHS_WINDOW_S = 60.0
MAX_DEATHS = 3
"""More deaths of one frontend than this within the window end the run."""
RESTART_BACKOFF_S = (0.5, 8.0)
"""A dead frontend's first restart waits the first; each next one twice as long, up to
the second."""
START_TIMEOUT_S = 120.0
"""How long a spawned frontend may take to bind and report (it imports gRPC and numpy, no torch)."""
STOP_TIMEOUT_S = 10.0


def check_tier_supported(config: LearnerConfig, env_spec: pb.EnvSpec) -> None:
    """Refuse, in one line, what the serving tier does not carry yet (auto never asks
    the tier for it: :func:`~learner.serving.auto.resolve_serving`)."""
    missing = tier_gaps(config, env_spec)
    if missing:
        raise UnsupportedSetup(
            f"{FLAG} {config.serving_processes} does not serve {', '.join(missing)} yet; "
            f"run with {FLAG} 0"
        )


def frame_layout(
    builder: TrajectoryBuilder, normalizer: Normalizer | None
) -> tuple[np.dtype, tuple[int, ...]]:
    """One env's frame as a table row holds it: what the stream sends, which normalisation
    may widen."""
    if normalizer is None:
        return builder.obs_dtype, tuple(builder.frame_shape)
    return normalizer.obs_dtype, tuple(normalizer.obs_shape)


def table_spec(
    config: LearnerConfig, builder: TrajectoryBuilder, normalizer: Normalizer | None
) -> TableSpec:
    """The table for this run: a row per env of ``--max-envs``, a lane per stream of
    ``--max-actors`` on each frontend (admission bounds them all together; the spare
    lanes cover a lease asked for before another frontend's release has arrived), rows
    as the engine reads its frames."""
    dtype, shape = frame_layout(builder, normalizer)
    return TableSpec(
        rows=config.max_envs,
        lanes=config.max_actors * frontends(config),
        obs_row_bytes=math.prod(shape) * np.dtype(dtype).itemsize,
        action_dtype=builder.action_dtype.str,
        action_shape=tuple(builder.action_shape),
    )


def shared_bytes(
    config: LearnerConfig,
    builder: TrajectoryBuilder,
    normalizer: Normalizer | None,
    count: int,
    multi_agent: bool = False,
    policies: bool = False,
) -> int:
    """Shared memory the tier of ``count`` frontends takes for this run: the slot table,
    the reply rows and a ring per frontend (the small admission and counter blocks aside);
    ``multi_agent``, ``policies``: as :func:`~learner.serving.tier_unrolls.reply_spec`'s."""
    table = replace(config, serving_processes=str(count))
    ring = RingSpec.of(builder, unroll_ring_capacity(config)).layout()
    return (
        sum(table_spec(table, builder, normalizer).sizes())
        + sum(layout_sizes(reply_spec(config, builder, normalizer, multi_agent, policies).layout()))
        + count * sum(layout_sizes(ring))
    )


@dataclass(eq=False)
class ModelLease:
    """One stream's lease as the model process keeps it."""

    lane: int
    begin: int
    count: int
    owner: int
    conn: Connection


class SlotBatcher:
    """Leases out lanes and rows, closes batches over the table, feeds the engine."""

    def __init__(
        self,
        table: SlotTable,
        engine: InferenceEngine,
        builder: ModelRows,
        stats: LearnerStats,
        config: LearnerConfig,
    ) -> None:
        self.table = table
        self.engine = engine
        self.builder = builder
        self.stats = stats
        self.max_frames = config.inference_batch_size
        self.timeout_s = config.inference_timeout_ms / 1000.0
        self.quorum = config.inference_quorum
        self.bells: dict[int, int] = {}
        """Frontend index -> its doorbell."""
        self._free_lanes = list(range(table.spec.lanes - 1, -1, -1))
        self._rows = RowSpans(table.spec.rows)
        self.leases: dict[int, ModelLease] = {}
        self._taken_L = np.zeros(table.spec.lanes, np.int64)
        """Each lane's last request taken; a lane without a lease keeps it at its ``req``,
        so a lane waits exactly while ``req_L != _taken_L``."""
        self._frames_L = np.zeros(table.spec.lanes, np.int64)
        self._wide_leases = 0
        """Leases of more than one row: while none is open, ready frames are ready lanes."""
        self._quorum_lanes = QUORUM_NONE
        self._due = asyncio.Event()
        self._deadline: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.lanes = LaneRows(
            table, *frame_layout(builder, engine.normalizer), builder.multi_agent,
            engine.agent_policy, builder.reply.policy_R,
        )  # fmt: skip
        self._closed = False
        self.batches = 0
        self.frames = 0

    # -- leases (per stream, from the control pipes)

    def lease(self, owner: int, count: int) -> tuple[int, int, str]:
        """(lane, first row, problem): a new stream's place, or why there is none."""
        begin = self._rows.take(count) if self._free_lanes else None
        if begin is None:
            return -1, -1, f"the serving table is full ({len(self.leases)} streams)"
        lane = self._free_lanes.pop()
        t = self.table
        t.rep_L[lane] = self._taken_L[lane] = t.req_L[lane]  # nothing in flight from before
        t.gen_L[lane] += 1  # a new stream: its rows start afresh
        conn = Connection(
            actor_id=f"frontend {owner} lane {lane}", run_id="", peer=f"frontend:{owner}",
            num_envs=count, slot_ids=self.builder.allocate_rows(begin, count),
        )  # fmt: skip
        self.lanes.open(lane, begin, count, owner, conn.slot_ids)
        if self.engine.self_play is not None:  # as one process does at a stream's first frame
            self.engine.self_play.reset(conn.slot_ids)  # no game under way in its envs
        self.leases[lane] = ModelLease(lane, begin, count, owner, conn)
        self._frames_L[lane] = count
        self._wide_leases += count > 1
        self._opened()
        return lane, begin, ""

    def release(self, lane: int) -> None:
        """A closed stream's lease back: its trajectory slots freed between batches."""
        lease = self.leases.pop(lane, None)
        if lease is None:
            return
        self._taken_L[lane] = self.table.req_L[lane]  # a frame it left unanswered never counts
        self._wide_leases -= lease.count > 1
        self.engine.release_later(lease.conn)
        self._rows.give_back(lease.begin, lease.count)
        self._free_lanes.append(lane)
        self._opened()

    def reclaim(self, owner: int) -> int:
        """Every lease of a dead frontend back; how many there were."""
        lanes = [lane for lane, lease in self.leases.items() if lease.owner == owner]
        for lane in lanes:
            self.release(lane)
        return len(lanes)

    def _opened(self) -> None:
        count = len(self.leases)
        self.stats.actors_connected = count
        self._quorum_lanes = math.ceil(self.quorum * count - 1e-9) if count else QUORUM_NONE
        self.rung()  # a closed stream may complete a batch

    # -- the batch loop

    def rung(self) -> None:
        """Frames arrived (the doorbell's reader, a lease come or gone): wake the loop when
        a batch is due, else make sure the deadline of the batch now forming is set. Looked
        at here, in the reader's callback, the rings of a forming batch cost a vector
        compare and a count each, not a wake of the loop's task."""
        waiting_L = self.table.req_L != self._taken_L
        lanes = int(np.count_nonzero(waiting_L))
        if not lanes:
            return
        if self._batch_due(waiting_L, lanes):
            self._due.set()
        elif self._deadline is None and self._loop is not None:
            self._deadline = self._loop.call_later(self.timeout_s, self._due.set)

    def _ready_lanes(self) -> np.ndarray:
        return np.flatnonzero(self.table.req_L != self._taken_L)

    def _batch_due(self, waiting_L: np.ndarray, lanes: int) -> bool:
        """Size or quorum: ``lanes`` lanes wait (mask ``waiting_L``)."""
        if lanes >= self._quorum_lanes:
            return True
        frames = lanes if not self._wide_leases else int(self._frames_L[waiting_L].sum())
        return frames >= self.max_frames

    async def run(self) -> None:
        """Until closed: when a batch is due (size, quorum or deadline), run it."""
        self._loop = asyncio.get_running_loop()
        self.rung()  # frames may have come before the loop ran
        while not self._closed:
            await self._due.wait()
            self._due.clear()
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            ready_B = self._ready_lanes()
            if len(ready_B):
                self._process(ready_B)
            self.rung()  # what came in meanwhile starts the next batch's clock

    def _process(self, ready_B: np.ndarray) -> None:
        """Serve the ready lanes' rows in one batch and publish their replies."""
        self._taken_L[ready_B] = self.table.req_L[ready_B]  # before the rows: req moves last
        self.batches += 1
        self.frames += int(self._frames_L[ready_B].sum())
        try:
            status_B = self.lanes.serve(self.engine, ready_B)
        except Exception:  # keep serving; fail only this batch's lanes
            log.exception("inference batch failed")
            status_B = np.full(len(ready_B), FAILED, np.int64)
        self._publish(ready_B, status_B)

    def _publish(self, lane_B: np.ndarray, status_B: np.ndarray) -> None:
        """The lanes' status, step and ``rep`` (the counter last, after every row), then
        one ring for each owning frontend."""
        t = self.table
        t.status_L[lane_B] = status_B
        t.step_L[lane_B] = self.engine.learner_step.value
        t.rep_L[lane_B] = self._taken_L[lane_B]
        for owner in np.unique(self.lanes.owner_L[lane_B]).tolist():
            bell = self.bells.get(owner)
            if bell is not None:
                ring(bell)

    def close(self) -> None:
        self._closed = True
        self._due.set()


def unroll_ring_capacity(config: LearnerConfig) -> int:
    """Unrolls one frontend's ring holds: two trainer batches, so a frontend writes the
    next while the drain takes the last."""
    return max(2 * config.batch_size, 16)


class PortLock:
    """The learner's port, held for the run: frontends bind it with ``SO_REUSEPORT``, which
    would let a second learner join the group silently, so a lock file says whose it is
    and a bind of its own first proves nobody else listens there."""

    def __init__(self, bind: str, port: int) -> None:
        directory = Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir())
        if bind.startswith("unix:"):  # one frontend binds the path; the lock is the path's
            self.port = 0
            self._probe_unix(bind)
            digest = hashlib.sha256(os.path.abspath(bind[5:]).encode()).hexdigest()[:16]
            self.path = directory / f"seedrl-unix-{digest}.lock"
            where = bind
        else:
            self.port = self._probe(bind, port)
            self.path = directory / f"seedrl-port-{self.port}.lock"
            where = f"{bind}:{self.port}"
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._fd)
            raise OSError(
                f"could not bind the learner to {where}: another seedrl learner holds it "
                f"({self.path})"
            ) from None

    @staticmethod
    def _probe_unix(bind: str) -> None:
        """A socket file nobody answers on is a dead learner's, which gRPC replaces; one
        that answers is another server's."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(bind[5:])
            except OSError:
                return
        raise OSError(f"could not bind the learner to {bind}: another process listens there")

    @staticmethod
    def _probe(bind: str, port: int) -> int:
        family = socket.AF_INET6 if ":" in bind.strip("[]") else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            # As gRPC binds: connections of a learner just stopped, lingering in TIME_WAIT,
            # do not hold the port; a listener (without SO_REUSEPORT here) still does.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((bind.strip("[]"), port))
            except OSError:
                raise OSError(
                    f"could not bind the learner to {bind}:{port} (port in use, or not this "
                    "host's address?)"
                ) from None
            return int(probe.getsockname()[1])

    def release(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


class ServingFailed(Exception):
    """A frontend kept dying: the run ends with this line, exit 1."""


class Frontend:
    """One spawned frontend process as its supervisor sees it."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.process: Any = None
        self.control: Any = None
        self.bell = new_doorbell()
        self.deaths: collections.deque[float] = collections.deque()


def answer_controls(batcher: SlotBatcher, asker: Frontend, frontends: list[Frontend]) -> None:
    """Answer ``asker``'s waiting control messages in order. A lease the table has no room
    for is tried again once every other frontend's waiting messages are taken: a frontend
    sends a closed stream's release before it gives the stream's admission back, so the
    rows a newly admitted stream needs may be waiting in another frontend's pipe."""
    while asker.control.poll():
        _answer(batcher, asker, asker.control.recv(), frontends)


def _answer(
    batcher: SlotBatcher, f: Frontend, message: tuple[Any, ...], frontends: list[Frontend]
) -> None:
    if message[0] == "release":
        batcher.release(message[1])
        return
    lease = batcher.lease(f.index, message[1])
    if lease[2] and frontends:  # full: first take the releases still in the other pipes
        for other in frontends:
            if other is f or other.control is None:
                continue
            with contextlib.suppress(EOFError, OSError):  # a dead one's sentinel tells
                while other.control.poll():
                    _answer(batcher, other, other.control.recv(), [])
        lease = batcher.lease(f.index, message[1])
    f.control.send(("lease", *lease))


class TierBlocks:
    """The blocks beside the slot table: the admission counts every frontend shares and
    the frontends' own counters, with the metrics the model reads from them."""

    def __init__(self, config: LearnerConfig, lock_dir: Path, frontends: list[Frontend]) -> None:
        self.frontends = frontends
        self.counts = SharedCounts.create(len(frontends), config.max_actors, lock_dir)
        self.counters = FrontendCounters(len(frontends))
        self.spec = StreamBlocks(self.counts.spec, self.counters.name, len(frontends))
        self.metrics = frontend_metrics(self.counters, self._pids)

    def _pids(self) -> list[int | None]:
        return [f.process.pid if f.process is not None else None for f in self.frontends]

    def forget(self, index: int) -> None:
        """A dead frontend's streams no longer count against the limits; its counts stay."""
        self.counts.forget(index)
        self.counters.retire(index)

    def close(self) -> None:
        self.counts.close()
        self.counters.close()


class TierServing:
    """The serving side with ``--serving-processes N``: the same start/stop as the
    in-process one, with frontends in place of the gRPC server."""

    def __init__(
        self,
        config: LearnerConfig,
        env_spec: pb.EnvSpec,
        learner_run_id: str,
        engine: InferenceEngine,
        builder: TrajectoryBuilder,
        stats: LearnerStats,
        auth_token: str | None,
        local_address: str | None = None,
        rank_addresses: Sequence[str] = (),
    ) -> None:
        self.lock = PortLock(config.bind, config.port)
        self._local_address = local_address
        self._rank_addresses = list(rank_addresses)
        self.port = self.lock.port
        # The token travels through the environment, never the config or argv.
        self.config = replace(config, port=self.port, auth_token=None, auth_token_file=None)
        self._token = auth_token
        self._env_spec = env_spec.SerializeToString()
        self._learner_run_id = learner_run_id
        spec = table_spec(config, builder, engine.normalizer)
        self.table = SlotTable(spec)
        assert isinstance(engine.builder, ModelRows)  # the frontends build the unrolls
        self.rows = engine.builder
        self.batcher = SlotBatcher(self.table, engine, self.rows, stats, config)
        self.model_bell = new_doorbell()
        self.frontends = [Frontend(i) for i in range(frontends(config))]
        self._builder_layout = builder.layout()
        ring_spec = RingSpec.of(builder, unroll_ring_capacity(config))
        self.rings = [UnrollRing(ring_spec) for _ in self.frontends]
        several = len(engine.stores) > 1
        self.drain = UnrollDrain(
            self.rings, engine.queue, engine.keep_unrolls, stats, engine.recorder,
            counts_episodes=not self.rows.counts_episodes,
            policies=list(zip(engine.stores, [s.stats for s in engine.served], strict=True))
            if several else None,
        )  # fmt: skip
        for frontend in self.frontends:
            self.batcher.bells[frontend.index] = frontend.bell
        self.blocks = TierBlocks(config, self.lock.path.parent, self.frontends)
        stats.sources.append(self.blocks.metrics)
        self._ctx = mp.get_context("spawn")  # gRPC starts fresh; the model may hold CUDA
        self._stopping = False
        self.failure: str | None = None
        self.on_failure: Callable[[str, bool], None] | None = None
        """Called once with the line that ends the run (the learner's stop request)."""
        self.batching: asyncio.Task[None] | None = None
        self._restarts: set[asyncio.Task[None]] = set()

    # -- the learner's serving interface

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_reader(self.model_bell, self._model_rung)
        self.drain.start(loop)
        await asyncio.gather(*(self._spawn(f) for f in self.frontends))

    def start_batching(self) -> None:
        self.batching = asyncio.create_task(self.batcher.run(), name="slot-batcher")

    async def stop(self, reason: str, final: bool) -> None:
        """Every frontend ends its streams with a Shutdown and exits; then the table goes."""
        self._stopping = True
        for task in self._restarts:
            task.cancel()
        loop = asyncio.get_running_loop()
        for f in self.frontends:
            if f.process is not None and f.process.is_alive():
                with contextlib.suppress(OSError):
                    f.control.send(("stop", reason, final))
        await asyncio.gather(*(asyncio.to_thread(self._end, f) for f in self.frontends))
        self.batcher.close()
        if self.batching is not None:
            self.batching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.batching
        with contextlib.suppress(Exception):
            loop.remove_reader(self.model_bell)
        await asyncio.to_thread(self.drain.stop)  # the frontends are gone: the rest is taken
        for fd in (self.model_bell, *(f.bell for f in self.frontends)):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.batcher.leases.clear()  # their row views go before the mapping
        self.table.close()
        self.blocks.close()
        for unroll_ring in self.rings:
            unroll_ring.close()
        self.rows.reply.close()
        self.lock.release()

    # -- frontends

    def _frontend_sockets(self, index: int) -> list[str]:
        """Every frontend's same-host socket, frontend ``index``'s own first. On a unix
        --bind frontend 0's is the bound path and the others' sit beside it, with its TLS:
        an actor offered the path it dialled stays, so frontend 0 only ever answers fresh
        dials, whose turns then alternate evenly (a second GetInfo through a socket of its
        own would take a turn there too)."""
        if self.config.bind.startswith("unix:"):
            bind = self.config.bind
            sockets = [frontend_bind_address(bind, i) for i in range(len(self.frontends))]
        elif self._local_address:
            local = self._local_address
            sockets = [frontend_local_address(local, i) for i in range(len(self.frontends))]
        else:
            return []
        return sockets[index:] + sockets[:index]

    async def _spawn(self, f: Frontend) -> None:
        parent, child = self._ctx.Pipe()
        args = (
            f.index, self.config, self._env_spec, self._learner_run_id, self.table.spec,
            self.table.shm.name, InheritedFd(self.model_bell), InheritedFd(f.bell), child,
            self.blocks.spec, self._frontend_unrolls(f),
            self._frontend_sockets(f.index), self._rank_addresses,
        )  # fmt: skip
        process = self._ctx.Process(
            target=frontend_main, args=args, name=f"seedrl-frontend-{f.index}", daemon=True
        )
        os.environ[TOKEN_ENV] = self._token or ""
        try:
            process.start()
        finally:
            os.environ.pop(TOKEN_ENV, None)
        child.close()
        f.process, f.control = process, parent
        message = None
        with contextlib.suppress(EOFError, OSError):  # EOF: it died before it was ready
            if await asyncio.to_thread(parent.poll, START_TIMEOUT_S):
                message = parent.recv()
        if not message or message[0] != "ready":
            process.kill()
            raise OSError(
                f"serving frontend {f.index} did not start (exit code {process.exitcode}); "
                f"its output above says why"
            )
        loop = asyncio.get_running_loop()
        loop.add_reader(parent.fileno(), self._on_control, f)
        loop.add_reader(process.sentinel, self._on_death, f)
        log.info("serving frontend %d (pid %d) on port %d", f.index, process.pid, self.port)

    def _frontend_unrolls(self, f: Frontend) -> FrontendUnrolls:
        """What frontend ``f`` builds its streams' unrolls with, and where it writes them."""
        reply = self.rows.reply
        return FrontendUnrolls(
            self._builder_layout, reply.spec, reply.name, self.rings[f.index].spec,
            self.rings[f.index].name, InheritedFd(self.drain.bell),
        )  # fmt: skip

    def _on_control(self, f: Frontend) -> None:
        """A frontend's per-stream messages: a lease asked for, a lease given back."""
        try:
            answer_controls(self.batcher, f, self.frontends)
        except (EOFError, OSError):  # the process died: its sentinel tells the rest
            asyncio.get_running_loop().remove_reader(f.control.fileno())

    def _on_death(self, f: Frontend) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(f.process.sentinel)
        with contextlib.suppress(Exception):
            loop.remove_reader(f.control.fileno())
        f.process.join(1.0)  # its pipes close a moment before it can be reaped
        code = f.process.exitcode
        if self._stopping:
            return
        lost = self.batcher.reclaim(f.index)
        self.blocks.forget(f.index)
        log.warning(
            "serving frontend %d died (exit code %s): its %d streams ended", f.index, code, lost
        )
        self._count_death(f, code)

    def _count_death(self, f: Frontend, code: int | None) -> None:
        """Restart a dead frontend with backoff, or end the run if it keeps dying."""
        now = time.monotonic()
        f.deaths.append(now)
        while f.deaths and now - f.deaths[0] > DEATHS_WINDOW_S:
            f.deaths.popleft()
        if len(f.deaths) > MAX_DEATHS:
            self.failure = (
                f"serving frontend {f.index} failed {len(f.deaths)} times in "
                f"{DEATHS_WINDOW_S:.0f} s (last exit code {code})"
            )
            log.error("%s", self.failure)
            if self.on_failure is not None:
                self.on_failure(self.failure, True)
            return
        delay = min(RESTART_BACKOFF_S[0] * 2 ** (len(f.deaths) - 1), RESTART_BACKOFF_S[1])
        task = asyncio.create_task(self._restart(f, delay), name=f"restart-frontend-{f.index}")
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)

    async def _restart(self, f: Frontend, delay: float) -> None:
        await asyncio.sleep(delay)
        if self._stopping:
            return
        drain(f.bell)
        try:
            await self._spawn(f)
        except OSError as exc:
            log.error("%s", exc)
            if not self._stopping:
                self._count_death(f, f.process.exitcode if f.process else None)

    def _model_rung(self) -> None:
        drain(self.model_bell)
        self.batcher.rung()

    @staticmethod
    def _end(f: Frontend) -> None:
        if f.process is None:
            return
        f.process.join(STOP_TIMEOUT_S)
        if f.process.is_alive():
            f.process.kill()
            f.process.join(STOP_TIMEOUT_S)


def build_tier(
    config: LearnerConfig,
    env_spec: pb.EnvSpec,
    learner_run_id: str,
    engine: InferenceEngine,
    builder: TrajectoryBuilder,
    stats: LearnerStats,
    auth_token: str | None,
    local_address: str | None = None,
    rank_addresses: Sequence[str] = (),
) -> TierServing:
    """The serving tier for this run, or one line (UnsupportedSetup) saying what it lacks;
    with ``local_address`` each frontend listens on a same-host socket of its own beside
    it and offers every frontend's in turn; ``rank_addresses``: every torchrun rank's
    address, which each frontend offers in GetInfo as the one-process servicer does."""
    check_tier_supported(config, env_spec)
    return TierServing(
        config, env_spec, learner_run_id, engine, builder, stats, auth_token, local_address,
        rank_addresses,
    )  # fmt: skip
