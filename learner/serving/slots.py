"""The serving tier's slot table: frame rows in one shared-memory block, eventfd doorbells.

Frontend processes serve the actors' streams; the model process owns the policy. They
meet here. Each admitted stream holds a *lease*: one lane (its request/reply counters)
and a contiguous run of K rows (its envs' frames and actions), handed out by the model
process over the frontend's control pipe, once per stream. Per frame a frontend writes
its rows, then bumps ``req_L[lane]``, then rings the model's doorbell; the model gathers
the lanes whose ``req`` is ahead of what it has taken, runs the forward pass, writes the
action rows and the lane's status, publishes ``rep_L[lane] = req_L[lane]`` and rings the
owning frontend once per batch. Only counters and doorbells cross per frame; nothing is
encoded or pickled. Stores are published in program order (x86 keeps stores in order and
every doorbell is a system call); another architecture needs release/acquire stores.

Shape suffixes: R rows in the table (envs, or a multi-agent env's agents), L lanes
(streams), A action dims.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from multiprocessing import reduction, shared_memory
from typing import Any

import numpy as np

OK, FAILED = 0, 1
"""A lane's reply status: actions written; the batch failed in the model process. Any
other status is a bad frame, :data:`REJECTED` says why (the stream ends with
INVALID_ARGUMENT)."""
REJECTED = {2: "observations: contains NaN or inf", 3: "rewards: contains NaN or inf"}
"""The engine's reasons to reject a frame, by the status that carries them."""

PROCESS_NAME = "seedrl-fe-"
"""A frontend's process name (``/proc/PID/comm``) is this and its index."""

_ONE = (1).to_bytes(8, "little")


@dataclass(frozen=True)
class TableSpec:
    """The shape of one slot table, laid out once from the env spec."""

    rows: int
    """Env rows across all leases (``--max-envs``)."""
    lanes: int
    """Streams at once (leases), across all frontends."""
    obs_row_bytes: int
    """One env's observation as the model reads it (the newest frame where frames are
    kept once; packed leaves for a dict/tuple space)."""
    action_dtype: str
    action_shape: tuple[int, ...]

    def sizes(self) -> list[int]:
        """Byte sizes of the block's arrays, in layout order, each on its own cache lines."""
        r, lanes = self.rows, self.lanes
        action_bytes = math.prod(self.action_shape) * np.dtype(self.action_dtype).itemsize
        raw = [
            r * self.obs_row_bytes, 4 * r, r, r, r * action_bytes,  # obs, reward, flags, action
            8 * lanes, 8 * lanes, 8 * lanes, 8 * lanes, 8 * lanes,  # req, rep, gen, status, step
            r,  # acting (a multi-agent env's rows that act)
        ]  # fmt: skip
        return [-(-n // 64) * 64 for n in raw]


class SlotTable:
    """Numpy views over the shared-memory block of ``spec`` (created when ``name`` is None).

    The row arrays are byte views too (``*_bytes``) so a frontend copies a frame's bytes in
    with one slice assignment and the model hands the engine zero-copy memoryviews.
    """

    def __init__(self, spec: TableSpec, name: str | None = None) -> None:
        self.spec = spec
        sizes = spec.sizes()
        self.owner = name is None
        try:
            self.shm = shared_memory.SharedMemory(name=name, create=self.owner, size=sum(sizes))
        except OSError as exc:
            raise OSError(
                f"could not create the serving tier's {sum(sizes) >> 20} MiB slot table in "
                f"shared memory ({exc}); a container needs a larger /dev/shm (shm_size), or "
                "lower --max-envs"
            ) from exc
        buf = self.shm.buf
        assert buf is not None  # None only after close
        parts, offset = [], 0
        for size in sizes:
            parts.append(buf[offset : offset + size])
            offset += size
        r, lanes = spec.rows, spec.lanes
        self.obs_bytes = np.frombuffer(parts[0], np.uint8, r * spec.obs_row_bytes)
        self.reward_bytes = np.frombuffer(parts[1], np.uint8, 4 * r)
        self.terminated_bytes = np.frombuffer(parts[2], np.uint8, r)
        self.truncated_bytes = np.frombuffer(parts[3], np.uint8, r)
        self.action_RA = np.frombuffer(
            parts[4], spec.action_dtype, r * math.prod(spec.action_shape)
        ).reshape(r, *spec.action_shape)
        self.req_L, self.rep_L, self.gen_L, self.status_L, self.step_L = (
            np.frombuffer(p, np.int64, lanes) for p in parts[5:10]
        )
        self.acting_bytes = np.frombuffer(parts[10], np.uint8, r)
        self._parts = parts

    def row_views(
        self, begin: int, count: int
    ) -> tuple[memoryview, memoryview, memoryview, memoryview]:
        """Rows ``[begin, begin + count)`` as byte views: observations, rewards (float32),
        terminated and truncated (bool), in the order a FramePayload takes them."""
        rb, end = self.spec.obs_row_bytes, begin + count
        obs, reward, terminated, truncated = self._parts[:4]
        return (
            obs[begin * rb : end * rb],
            reward[4 * begin : 4 * end],
            terminated[begin:end],
            truncated[begin:end],
        )

    def acting_view(self, begin: int, count: int) -> memoryview:
        """Rows ``[begin, begin + count)``'s acting flags (bool) as a byte view: which rows
        of a multi-agent env's frame act (unused for a single-agent env)."""
        return self._parts[10][begin : begin + count]

    def close(self) -> None:
        """Unmap the block (and remove it, for the creator); views must not be used after."""
        del self.obs_bytes, self.reward_bytes, self.terminated_bytes, self.truncated_bytes
        del self.acting_bytes
        del self.action_RA, self.req_L, self.rep_L, self.gen_L, self.status_L, self.step_L
        for part in self._parts:
            with contextlib.suppress(BufferError):  # a caller's view of it is still alive
                part.release()
        self._parts = []
        try:
            self.shm.close()
        except BufferError:  # a caller still holds a row view: the mapping ends with the process
            self.shm._mmap = None  # type: ignore[attr-defined]
        if self.owner:
            with contextlib.suppress(FileNotFoundError):
                self.shm.unlink()


class RowSpans:
    """First-fit allocation of contiguous row runs (one per lease)."""

    def __init__(self, rows: int) -> None:
        self.free_R = np.ones(rows, bool)

    def take(self, count: int) -> int | None:
        """The first row of ``count`` free contiguous rows, now taken; None if none is."""
        sums = np.concatenate([[0], np.cumsum(self.free_R, dtype=np.int64)])
        fits = np.flatnonzero(sums[count:] - sums[:-count] == count)
        if not len(fits):
            return None
        begin = int(fits[0])
        self.free_R[begin : begin + count] = False
        return begin

    def give_back(self, begin: int, count: int) -> None:
        self.free_R[begin : begin + count] = True


def new_doorbell() -> int:
    """An eventfd: rings add to its counter, and the owner's event loop waits on it with
    ``add_reader`` (the only doorbell asyncio and uvloop can wait on without a thread)."""
    return os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)


def ring(fd: int) -> None:
    with contextlib.suppress(BlockingIOError):  # the counter is full: it is rung already
        os.write(fd, _ONE)


def drain(fd: int) -> None:
    """Consume the doorbell's rings (all of them: one read clears an eventfd)."""
    with contextlib.suppress(BlockingIOError):
        os.read(fd, 8)


class InheritedFd:
    """A descriptor handed to a spawned child: pickled as a duplicate the child inherits
    (multiprocessing passes it with the spawn), unpickled as the child's int descriptor."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        return _inherited, (reduction.DupFd(self.fd),)


def _inherited(dup: Any) -> int:
    return int(dup.detach())
