"""The candidate transport of the serving tier: frame rows in a shared-memory slot table.

Frontend processes own disjoint ranges of slots. For each frame a frontend writes the
slot's row (observation, reward, done), then bumps the slot's request counter ``req`` and
rings the model's doorbell. The model process finds the slots whose ``req`` is ahead of
their reply counter ``rep`` with one vector compare, gathers their rows, runs one forward
pass, writes the actions, publishes ``rep = req`` for those slots and rings each
frontend that owns one. Only counters and doorbells cross per frame; no message is
encoded. Stores are published in program order (x86 keeps stores in order, and every
doorbell is a system call); a native build would use release/acquire atomics instead.

Shape suffixes: S slots in the table, B slots in one batch, O observation bytes per row.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import shared_memory
from multiprocessing.context import BaseContext
from typing import Any

import numpy as np

BELLS = ("eventfd", "semaphore", "poll")
"""Doorbells the benchmark compares: an eventfd (a file descriptor asyncio can wait on),
a POSIX semaphore (a futex; needs a thread to wait in an event loop), and polling with a
short sleep (no system call to ring, a wake-up every poll interval)."""

POLL_INTERVAL_S = 50e-6
"""How long the polling doorbell sleeps between looks (the kernel rounds it up)."""

WARMUP, MEASURE, STOP = 0, 1, 2
"""Phases the orchestrator sets in the control block."""

TAG_SHIFT = 32
"""The tag policy's action is ``slot << TAG_SHIFT | sequence``: the frame's own identity."""


@dataclass(frozen=True)
class TableSpec:
    """The shape of one slot table: S slots of one observation row each."""

    slots: int
    obs_shape: tuple[int, ...]
    obs_dtype: str
    frontends: int

    @property
    def obs_bytes(self) -> int:
        return int(np.prod(self.obs_shape)) * np.dtype(self.obs_dtype).itemsize

    def owner_ranges(self) -> list[tuple[int, int]]:
        """Each frontend's slots ``[begin, end)``: contiguous, as even as S allows."""
        edges = np.linspace(0, self.slots, self.frontends + 1).round().astype(int)
        return [(int(a), int(b)) for a, b in itertools.pairwise(edges)]


class SlotTable:
    """Numpy views over one shared-memory block laid out for ``spec``.

    ``req_S`` and ``rep_S`` are int64 counters: a slot holds a frame waiting for its action
    while ``req_S[s] != rep_S[s]``. ``control`` holds the phase and the frontends that
    finished draining.
    """

    def __init__(self, spec: TableSpec, name: str | None = None) -> None:
        self.spec = spec
        sizes = self._sizes(spec)
        create = name is None
        self.shm = shared_memory.SharedMemory(name=name, create=create, size=sum(sizes))
        buf, offset, views = self.shm.buf, 0, []
        assert buf is not None  # None only after close
        for size in sizes:
            views.append(buf[offset : offset + size])
            offset += size
        s, f = spec.slots, spec.frontends

        def view(i: int, dtype: Any, count: int) -> np.ndarray:
            return np.frombuffer(views[i], dtype, count=count)

        self.obs_SO = view(0, spec.obs_dtype, s * int(np.prod(spec.obs_shape))).reshape(
            s, *spec.obs_shape
        )
        self.reward_S = view(1, np.float32, s)
        self.done_S = view(2, np.uint8, s)
        self.req_S = view(3, np.int64, s)
        self.rep_S = view(4, np.int64, s)
        self.action_S = view(5, np.int64, s)
        self.control = view(6, np.int64, 2 + f)
        if create:
            for arr in (self.req_S, self.rep_S, self.action_S, self.control):
                arr[:] = 0

    @staticmethod
    def _sizes(spec: TableSpec) -> list[int]:
        s = spec.slots
        raw = [s * spec.obs_bytes, 4 * s, s, 8 * s, 8 * s, 8 * s, 8 * (2 + spec.frontends)]
        return [-(-n // 64) * 64 for n in raw]  # each array on its own cache lines

    @property
    def phase(self) -> int:
        return int(self.control[0])

    def close(self) -> None:
        """Unmap the block; only for the creator (a child's mapping ends with its process,
        and its loop's locals still hold views)."""
        # Views must go before the mapping can close.
        del self.obs_SO, self.reward_S, self.done_S, self.req_S, self.rep_S, self.action_S
        del self.control
        self.shm.close()


class Bell:
    """One doorbell: ``ring`` from any process, ``wait`` in the one that owns it."""

    def ring(self) -> None:
        raise NotImplementedError

    def wait(self, timeout_s: float) -> None:
        """Return when rung (its rings consumed) or after ``timeout_s``."""
        raise NotImplementedError


class EventfdBell(Bell):
    """An eventfd: rings add to one counter, a wait reads and clears it."""

    def __init__(self) -> None:
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._one = (1).to_bytes(8, "little")

    def ring(self) -> None:
        os.write(self.fd, self._one)

    def wait(self, timeout_s: float) -> None:
        readable, _, _ = select.select([self.fd], [], [], max(timeout_s, 0.0))
        if readable:
            with contextlib.suppress(BlockingIOError):  # only if another waiter took it
                os.read(self.fd, 8)


class SemaphoreBell(Bell):
    """A POSIX semaphore: one post per ring; a wait takes one and drains the rest."""

    def __init__(self, ctx: BaseContext) -> None:
        self.sem = ctx.Semaphore(0)

    def ring(self) -> None:
        self.sem.release()

    def wait(self, timeout_s: float) -> None:
        if self.sem.acquire(timeout=max(timeout_s, 0.0)):
            while self.sem.acquire(block=False):
                pass


class PollBell(Bell):
    """No doorbell: the waiter sleeps a poll interval and looks again."""

    def ring(self) -> None:
        pass

    def wait(self, timeout_s: float) -> None:
        time.sleep(min(POLL_INTERVAL_S, max(timeout_s, 0.0)))


def make_bell(kind: str, ctx: BaseContext) -> Bell:
    if kind == "eventfd":
        return EventfdBell()
    if kind == "semaphore":
        return SemaphoreBell(ctx)
    if kind == "poll":
        return PollBell()
    raise ValueError(f"unknown doorbell {kind!r}; one of {BELLS}")


# ---------------------------------------------------------------------------- policies


def tag_policy(obs_BO: np.ndarray) -> np.ndarray:
    """The frame's identity (its first 8 bytes, written by the frontend) as its action."""
    rows = np.ascontiguousarray(obs_BO).reshape(len(obs_BO), -1).view(np.uint8)
    return rows[:, :8].copy().view(np.int64).ravel()


class MLPPolicy:
    """CartPole's 64x64 tanh MLP, greedy: a real forward pass of the learner's default size."""

    def __init__(self, obs_dim: int, actions: int = 2, hidden: int = 64) -> None:
        rng = np.random.default_rng(0)
        self.w1 = rng.standard_normal((obs_dim, hidden)).astype(np.float32) * 0.5
        self.w2 = rng.standard_normal((hidden, hidden)).astype(np.float32) * 0.2
        self.w3 = rng.standard_normal((hidden, actions + 1)).astype(np.float32) * 0.2

    def __call__(self, obs_BO: np.ndarray) -> np.ndarray:
        h = np.tanh(obs_BO @ self.w1)
        h = np.tanh(h @ self.w2)
        return np.argmax((h @ self.w3)[:, :-1], axis=1)


class PixelStandIn:
    """A cheap stand-in for the Atari CNN: a linear map of a strided view of the frame, so
    the model's cost beyond its forward pass shows (the CNN itself is timed elsewhere)."""

    def __init__(self, obs_shape: tuple[int, ...], actions: int = 6) -> None:
        rng = np.random.default_rng(0)
        self._view = tuple(slice(None, None, 8) for _ in obs_shape)
        size = int(np.prod(np.zeros(obs_shape, np.uint8)[self._view].shape))
        self.w = rng.standard_normal((size, actions)).astype(np.float32) / 255.0

    def __call__(self, obs_BO: np.ndarray) -> np.ndarray:
        x = obs_BO[(slice(None), *self._view)].reshape(len(obs_BO), -1).astype(np.float32)
        return np.argmax(x @ self.w, axis=1)


def make_policy(name: str, spec: TableSpec) -> Callable[[np.ndarray], np.ndarray]:
    if name == "tag":
        return tag_policy
    if name == "mlp":
        return MLPPolicy(int(np.prod(spec.obs_shape)))
    if name == "pixels":
        return PixelStandIn(spec.obs_shape)
    raise ValueError(f"unknown policy {name!r}")


# ---------------------------------------------------------------------------- processes


@dataclass(frozen=True)
class RunSpec:
    """One measured run: the table, the doorbell, the policy and the batch rule."""

    table: TableSpec
    bell: str
    policy: str
    quorum: int
    """Slots ready that close a batch at once."""
    deadline_s: float
    """A batch closes this long after its first ready slot was seen, however few."""
    drain_timeout_s: float = 5.0
    """At stop, how long a frontend waits for its frames in flight to be answered."""
    latency_samples: int = 200_000


def model_main(
    spec: RunSpec, name: str, model_bell: Bell, frontend_bells: list[Bell], out: Any
) -> None:
    """The model process: serve until every frontend has drained, then send the counts."""
    table = SlotTable(spec.table, name)
    out.send(_model_loop(spec, table, model_bell, frontend_bells))
    table.close()  # the loop's views are gone with its frame


def _model_loop(
    spec: RunSpec, table: SlotTable, model_bell: Bell, frontend_bells: list[Bell]
) -> dict[str, Any]:
    """Per batch: gather the ready rows, one forward pass, write actions, ring owners."""
    policy = make_policy(spec.policy, spec.table)
    req_S, rep_S, obs_SO, action_S = table.req_S, table.rep_S, table.obs_SO, table.action_S
    control, frontends = table.control, spec.table.frontends
    owner_S = np.zeros(spec.table.slots, np.int64)
    for f, (a, b) in enumerate(spec.table.owner_ranges()):
        owner_S[a:b] = f
    served_S = np.zeros(spec.table.slots, np.int64)
    phases = {"gather": 0.0, "forward": 0.0, "reply": 0.0}
    frames = batches = 0
    cpu0 = 0.0
    first_seen = None
    measuring = False
    clock = time.thread_time
    while True:
        if not measuring and control[0] >= MEASURE:
            measuring, cpu0 = True, time.process_time()
            frames = batches = 0
            phases = dict.fromkeys(phases, 0.0)
        ready_B = np.flatnonzero(req_S != rep_S)
        now = time.perf_counter()
        if len(ready_B) and first_seen is None:
            first_seen = now
        due = first_seen is not None and now - first_seen >= spec.deadline_s
        if len(ready_B) >= spec.quorum or (len(ready_B) and due):
            t0 = clock()
            seq_B = req_S[ready_B]  # read before the rows: a frontend bumps req after them
            obs_BO = obs_SO[ready_B]
            t1 = clock()
            action_B = policy(obs_BO)
            t2 = clock()
            action_S[ready_B] = action_B
            rep_S[ready_B] = seq_B
            served_S[ready_B] += 1
            for f in np.unique(owner_S[ready_B]):
                frontend_bells[f].ring()
            t3 = clock()
            phases["gather"] += t1 - t0
            phases["forward"] += t2 - t1
            phases["reply"] += t3 - t2
            frames += len(ready_B)
            batches += 1
            first_seen = None
            continue
        if control[0] == STOP and control[2 : 2 + frontends].all():
            break
        remaining = spec.deadline_s if first_seen is None else spec.deadline_s - (now - first_seen)
        model_bell.wait(min(remaining, 0.05))
    cpu = time.process_time() - cpu0
    return {
        "frames": frames, "batches": batches, "cpu_s": cpu, "phases_s": phases,
        "served_S": served_S.tolist(),
    }  # fmt: skip


def frontend_main(
    spec: RunSpec, index: int, name: str, model_bell: Bell, own_bell: Bell, out: Any
) -> None:
    """A frontend process: stream frames through its slots until told to stop and drained."""
    table = SlotTable(spec.table, name)
    out.send(_frontend_loop(spec, index, table, model_bell, own_bell))
    table.close()  # the loop's views are gone with its frame


def _frontend_loop(
    spec: RunSpec, index: int, table: SlotTable, model_bell: Bell, own_bell: Bell
) -> dict[str, Any]:
    """For each answered slot: check its action, take it, write the slot's next frame."""
    begin, end = spec.table.owner_ranges()[index]
    req_S, rep_S, action_S = table.req_S, table.rep_S, table.action_S
    obs_SO, reward_S, done_S, control = table.obs_SO, table.reward_S, table.done_S, table.control
    check_tag = spec.policy == "tag"
    tape = _obs_tape(spec.table)
    sent_at = np.zeros(spec.table.slots, np.float64)
    latency = np.zeros(spec.latency_samples, np.float64)
    samples = 0
    answered_S = np.zeros(spec.table.slots, np.int64)
    errors: list[str] = []
    frames = 0
    cpu0 = 0.0
    measuring = False
    perf = time.perf_counter

    def send(slot: int) -> None:
        seq = int(req_S[slot]) + 1
        row = obs_SO[slot]
        row[...] = tape[seq % len(tape)]
        if check_tag:
            row.reshape(-1).view(np.uint8)[:8] = np.frombuffer(
                ((slot << TAG_SHIFT) | seq).to_bytes(8, "little"), np.uint8
            )
        reward_S[slot] = 1.0
        done_S[slot] = seq % 200 == 0
        sent_at[slot] = perf()
        req_S[slot] = seq  # last: the row is complete once the counter moves

    for slot in range(begin, end):
        send(slot)
    model_bell.ring()
    deadline = None
    while True:
        phase = control[0]
        if not measuring and phase >= MEASURE:
            measuring, cpu0, frames = True, time.process_time(), 0
        if phase == STOP and deadline is None:
            deadline = perf() + spec.drain_timeout_s
        mine = np.flatnonzero(rep_S[begin:end] == req_S[begin:end]) + begin
        mine = mine[answered_S[mine] < req_S[mine]]  # answered, and not yet taken
        if len(mine):
            now = perf()
            for slot in mine.tolist():
                seq = int(req_S[slot])
                if check_tag and int(action_S[slot]) != (slot << TAG_SHIFT) | seq and not errors:
                    errors.append(
                        f"slot {slot} frame {seq}: action {int(action_S[slot]):#x} is not "
                        f"its own tag {(slot << TAG_SHIFT) | seq:#x}"
                    )
                answered_S[slot] = seq
                if measuring and phase == MEASURE and samples < len(latency):
                    latency[samples] = now - sent_at[slot]
                    samples += 1
                frames += 1
                if deadline is None:
                    send(slot)
            if deadline is None:
                model_bell.ring()
        if deadline is not None and (
            (answered_S[begin:end] == req_S[begin:end]).all() or perf() > deadline
        ):
            break
        own_bell.wait(0.05 if deadline is None else max(deadline - perf(), 0.0))
    cpu = time.process_time() - cpu0
    control[2 + index] = 1
    model_bell.ring()
    unanswered = int((answered_S[begin:end] != req_S[begin:end]).sum())
    return {
        "frames": frames, "cpu_s": cpu, "latency_s": latency[:samples].tolist(),
        "errors": errors, "unanswered": unanswered,
        "requested_S": req_S[begin:end].tolist(), "begin": begin,
    }  # fmt: skip


def _obs_tape(spec: TableSpec, rows: int = 64) -> np.ndarray:
    """Frames to replay: random rows of the observation's shape and dtype."""
    rng = np.random.default_rng(1)
    shape = (rows, *spec.obs_shape)
    if np.dtype(spec.obs_dtype).kind == "f":
        return rng.standard_normal(shape).astype(spec.obs_dtype)
    return rng.integers(0, 256, shape).astype(spec.obs_dtype)
