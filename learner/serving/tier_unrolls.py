"""The serving tier's trajectories: built in the frontends, carried to the trainer in shared memory.

With ``--serving-processes N`` the model process does per-batch work only. Besides the
slot table's action rows it writes, per batch, what a frontend's trajectory builder needs
of each row it answered (:class:`ReplyRows`): the ``first`` flag the policy saw, the
behaviour parameters, the learner step of the weights that acted, the core state before
the row (an unroll starting there keeps it) and, with --normalize-observations, the
observation as the policy saw it. :class:`ModelRows` is the builder's per-batch half that
stays in the model process: each slot's ``first`` flag, frame stack and recurrent state.

Each frontend records the rows of every lane answered in one doorbell pass into its own
:class:`~learner.state.trajectories.TrajectoryBuilder` (:class:`FrontendTrajectories`) and
writes finished unrolls and ended episodes into its :class:`UnrollRing`: one writer, one
reader, a committed count bumped after the rows, so a frontend that dies mid-write leaves
no half unroll. :class:`UnrollDrain`, a thread of the model process, looks at every ring
when a frontend rings it (a write that leaves half a ring committed, a trainer batch's
worth) and otherwise on a period (so the model process wakes for unrolls a bounded number
of times a second whatever the frame rate), moves each ring's committed unrolls, all at
once, into the learner's store (waiting while it is full, which fills the rings and so
pauses the frontends: back-pressure) and episodes into its stats; per frame the model
process touches none of it.

Shape suffixes: R table rows, S builder slots, B rows of one record, P policy parameters,
H core state size, C ring capacity in unrolls, E ring capacity in episodes, O observation dims.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import os
import select
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import TYPE_CHECKING, Any

import numpy as np

from learner.serving.slots import InheritedFd, SlotTable, drain, new_doorbell, ring
from learner.state.stats import LearnerStats
from learner.state.trajectories import FinishedEpisodes, TrajectoryBuilder, Unrolls
from seedrl.config import LearnerConfig

if TYPE_CHECKING:  # torch and heavier: the frontends (importing this module) never load them
    from learner.agents.base import Store
    from learner.state.dataset import EpisodeRecorder
    from learner.state.normalize import Normalizer

Layout = tuple[tuple[str, tuple[int, ...], str], ...]
"""Named arrays of one shared block: (name, shape, dtype string)."""

ORIGIN_FIELDS = ("origin_slot", "origin_index")
"""Per unroll in a ring: the frontend's builder slot it came from and its number among
that slot's unrolls (the builder's ``last_origin``), which ``--record-dataset`` stitches
episodes by."""
UNPLAYED = -1
"""A frontend slot's policy before its first row."""
NO_POLICIES = np.zeros(0, np.int64)
"""The policies of no unroll: what a ring says before its first read."""
FRONTEND_SLOTS = 2**32
"""A frontend's builder slots, numbered apart from every other's: frontend i's slot s is
``i * FRONTEND_SLOTS + s`` wherever slots of several frontends meet (the dataset recorder)."""
RING_EPISODES = 4096
"""Ended episodes a ring holds between two drains."""
ROOM_POLL_S = 0.002
"""How often a frontend whose ring is full looks for room again (only while it is full)."""
DRAIN_PERIOD_S = 0.05
"""How often the drain thread takes what the rings committed when no frontend rang it:
unrolls short of half a ring wait that long at most. Half a ring is a trainer batch, so
the trainer waits on the period only for the last unrolls of a batch spread over several
frontends; each wake of the drain costs the model process more than its copy."""


def layout_sizes(layout: Layout) -> list[int]:
    """Byte sizes of ``layout``'s arrays in one block, each on its own cache lines."""
    return [
        -(-(math.prod(shape) * np.dtype(dtype).itemsize) // 64) * 64 for _, shape, dtype in layout
    ]


class SharedArrays:
    """Numpy arrays of ``layout`` in one shared-memory block (created when ``name`` is None)."""

    def __init__(self, layout: Layout, name: str | None = None) -> None:
        sizes = layout_sizes(layout)
        self.owner = name is None
        try:
            self.shm = shared_memory.SharedMemory(
                name=name, create=self.owner, size=max(64, sum(sizes))
            )
        except OSError as exc:
            raise OSError(
                f"could not create the serving tier's {sum(sizes) >> 20} MiB of unroll buffers "
                f"in shared memory ({exc}); a container needs a larger /dev/shm (shm_size)"
            ) from exc
        self.arrays: dict[str, np.ndarray] = {}
        offset = 0
        for (key, shape, dtype), size in zip(layout, sizes, strict=True):
            self.arrays[key] = np.ndarray(shape, dtype, buffer=self.shm.buf, offset=offset)
            offset += size

    @property
    def name(self) -> str:
        return self.shm.name

    def close(self) -> None:
        """Unmap the block (and remove it, for the creator); its arrays must not be used after."""
        self.arrays.clear()
        try:
            self.shm.close()
        except BufferError:  # a caller still holds a view: the mapping ends with the process
            self.shm._mmap = None  # type: ignore[attr-defined]
        if self.owner:
            with contextlib.suppress(FileNotFoundError):
                self.shm.unlink()


# ---------------------------------------------------------------------- reply rows


@dataclass(frozen=True)
class ReplySpec:
    """What the model writes per answered row for the frontends' builders."""

    rows: int
    param_size: int
    state_sizes: tuple[int, ...]
    seen_shape: tuple[int, ...] | None
    """The normalized observation's shape with --normalize-observations (the frontend
    stores what the policy saw), else None (it stores the frame it wrote)."""
    multi_agent: bool = False
    """A multi-agent env's rows: only the rows the learning policy stepped on are
    recorded, with their credited rewards, which the model writes (``recorded``,
    ``reward``); a single-agent env's frontend records every row with the reward it wrote."""
    policies: bool = False
    """Rows of several policies (--policy-mapping, a population's members): the model
    writes the policy that played each row (``policy``), which its unroll and episode are
    that policy's."""

    def layout(self) -> Layout:
        r = self.rows
        parts = [
            ("first", (r,), "|b1"),
            ("step", (r,), "<i8"),
            ("params", (r, self.param_size), "<f4"),
        ]
        parts += [(f"state{i}", (r, h), "<f4") for i, h in enumerate(self.state_sizes)]
        if self.seen_shape is not None:
            parts.append(("seen", (r, *self.seen_shape), "<f4"))
        if self.multi_agent:
            parts += [("recorded", (r,), "|b1"), ("reward", (r,), "<f4")]
        if self.policies:
            parts.append(("policy", (r,), "<i8"))
        return tuple(parts)


class ReplyRows(SharedArrays):
    """Per table row: ``first``, learner step, behaviour parameters, core state before the
    row, the seen observation (with --normalize-observations), for a multi-agent env
    whether the row is recorded and its credited reward, and with several policies the
    one that played it."""

    def __init__(self, spec: ReplySpec, name: str | None = None) -> None:
        super().__init__(spec.layout(), name)
        self.spec = spec
        a = self.arrays
        self.first_R, self.step_R, self.params_RP = a["first"], a["step"], a["params"]
        self.state_RH = tuple(a[f"state{i}"] for i in range(len(spec.state_sizes)))
        self.seen_RO = a.get("seen")
        self.recorded_R = a.get("recorded")
        self.reward_R = a.get("reward")
        self.policy_R = a.get("policy")

    def close(self) -> None:
        del self.first_R, self.step_R, self.params_RP, self.state_RH, self.seen_RO
        del self.recorded_R, self.reward_R, self.policy_R
        super().close()


class ModelRows(TrajectoryBuilder):
    """The trajectory builder's per-batch half in the model process: each slot's ``first``
    flag, frame stack and recurrent state, and its row in the slot table. It keeps no
    unroll: :meth:`record` writes what the frontend's builder needs into the reply rows."""

    def __init__(
        self, builder: TrajectoryBuilder, reply: ReplyRows, counts_episodes: bool = False
    ) -> None:
        """``counts_episodes``: end the learning policy's episodes here too, as the
        builder does, and return them from :meth:`record` (self-play, whose game results
        the model's league records as they end); the frontends' then go uncounted."""
        layout = builder.layout()
        self.unroll_layout = (int(layout["unroll_length"]), int(layout["overlap"]))
        """The frontends' unroll length and overlap, which say how many frames a closed
        stream's partial unrolls held."""
        # One-row unrolls: the base class's unroll arrays stay small; only its first
        # flags, stacks and core state are used.
        super().__init__(**{**layout, "unroll_length": 1, "overlap": 0, "return_discount": None})
        self.reply = reply
        self.counts_episodes = counts_episodes

    row_S: np.ndarray
    """Each slot's row in the slot table."""

    @property
    def multi_agent(self) -> bool:
        """Rows of a multi-agent env: the frontends record only the rows marked recorded."""
        return self.reply.spec.multi_agent

    recorded_S: np.ndarray
    """Frames each slot recorded since it was allocated."""

    def _grow(self, capacity: int) -> None:
        previous = {name: self.__dict__.get(name) for name in ("row_S", "recorded_S")}
        super()._grow(capacity)
        for name, old in previous.items():
            new = np.zeros(capacity, np.int64)
            if old is not None:
                new[: len(old)] = old
            setattr(self, name, new)

    def allocate_rows(self, begin: int, count: int) -> np.ndarray:
        """Fresh slots for a stream whose ``count`` table rows start at ``begin``."""
        ids = self.allocate(count)
        self.row_S[ids] = np.arange(begin, begin + count)
        self.recorded_S[ids] = 0
        return ids

    def release(self, ids: np.ndarray) -> int:
        """Slots back to the pool; the frames their frontend's partial unrolls held, which
        are lost."""
        self._free.extend(int(i) for i in ids)
        return self._partial_frames(ids)

    def restart(self, ids: np.ndarray) -> int:
        """As the builder's (a population's slot moved to another member as its episode
        ended); the frames its frontend's partial unrolls held, which its frontend drops
        when the slot's next row comes with the other member's policy."""
        lost = self._partial_frames(ids)
        super().restart(ids)
        self.recorded_S[ids] = 0
        return lost

    def _partial_frames(self, ids: np.ndarray) -> int:
        """Frames in the frontend's partial unrolls of slots ``ids``: where its builder
        stands after recording every frame answered here."""
        length, overlap = self.unroll_layout
        n_S = self.recorded_S[ids]
        position_S = np.where(
            n_S <= length, n_S, 1 + overlap + (n_S - length - 1) % (length - overlap)
        )
        return int(position_S.sum())

    def credit_waits(
        self, slot_B: np.ndarray, reward_B: np.ndarray, step_B: np.ndarray
    ) -> np.ndarray:
        """As the builder's, for every row of a multi-agent batch (the serving core asks
        it once per such batch, before it records the learning policy's rows): so each of
        those rows is marked unrecorded here, and :meth:`record` marks the ones it records."""
        assert self.reply.recorded_R is not None, "a multi-agent batch needs multi-agent reply rows"
        self.reply.recorded_R[self.row_S[slot_B]] = False
        return super().credit_waits(slot_B, reward_B, step_B)

    def record(
        self,
        slot_B: np.ndarray,
        obs_BO: np.ndarray,
        reward_B: np.ndarray,
        terminated_B: np.ndarray,
        truncated_B: np.ndarray,
        first_B: np.ndarray,
        action_BA: np.ndarray,
        params_BP: np.ndarray,
        state_before_BH: tuple[np.ndarray, ...],
        state_after_BH: tuple[np.ndarray, ...],
        learner_step: int | np.ndarray,
    ) -> tuple[Unrolls | None, FinishedEpisodes | None]:
        """The rows' reply for the frontends' builders, and the slots' next first flag and
        core state; no unrolls or episodes here (the frontends build them)."""
        reply, row_B = self.reply, self.row_S[slot_B]
        if reply.recorded_R is not None:  # a multi-agent env's: these rows, credited so
            assert reply.reward_R is not None
            reply.recorded_R[row_B] = True
            reply.reward_R[row_B] = reward_B
        reply.first_R[row_B] = first_B
        reply.step_R[row_B] = learner_step
        reply.params_RP[row_B] = params_BP
        for rows, before in zip(reply.state_RH, state_before_BH, strict=True):
            rows[row_B] = before
        if reply.seen_RO is not None:
            reply.seen_RO[row_B] = obs_BO
        for store, after in zip(self.core_state_SH, state_after_BH, strict=True):
            store[slot_B] = after
        done_B = terminated_B | truncated_B
        self.next_first_S[slot_B] = done_B
        self.recorded_S[slot_B] += 1
        if self.counts_episodes:
            return None, self._episode_stats(slot_B, reward_B, done_B)
        return None, None


def reply_spec(
    config: LearnerConfig,
    builder: TrajectoryBuilder,
    normalizer: Normalizer | None,
    multi_agent: bool = False,
    policies: bool = False,
) -> ReplySpec:
    """The reply rows of this run: one per env of ``--max-envs`` (per agent of a
    multi-agent env's, which counts its agents as envs there); ``policies``: several
    policies play its rows."""
    layout = builder.layout()
    return ReplySpec(
        rows=config.max_envs,
        param_size=int(layout["param_size"]),
        state_sizes=tuple(layout["core_state_sizes"]),
        seen_shape=None if normalizer is None else tuple(normalizer.obs_shape),
        multi_agent=multi_agent,
        policies=policies,
    )


def model_rows(
    config: LearnerConfig,
    builder: TrajectoryBuilder,
    normalizer: Normalizer | None,
    multi_agent: bool = False,
    policies: bool = False,
) -> ModelRows:
    """The model process's rows for this run, with their reply block created; with
    --self-play it ends the episodes itself (the league records each game as it ends)."""
    reply = ReplyRows(reply_spec(config, builder, normalizer, multi_agent, policies))
    return ModelRows(builder, reply, counts_episodes=config.self_play)


# ---------------------------------------------------------------------- the unroll ring


@dataclass(frozen=True)
class RingSpec:
    """One frontend's ring: ``capacity`` unrolls of one builder's shapes, and episodes."""

    capacity: int
    fields: Layout
    """One unroll's fields as the ring keeps them (core state parts as ``core_state<i>``)."""
    episodes: int = RING_EPISODES

    @staticmethod
    def of(builder: TrajectoryBuilder, capacity: int) -> RingSpec:
        template = builder.empty_unrolls(1)
        fields: list[tuple[str, tuple[int, ...], str]] = []
        for f in dataclasses.fields(template):
            value = getattr(template, f.name)
            if f.name == "core_state":
                fields += [
                    (f"core_state{i}", s.shape[1:], s.dtype.str) for i, s in enumerate(value)
                ]
            elif value is not None and f.name not in ("sample_id", "sample_weight"):
                fields.append((f.name, value.shape[1:], value.dtype.str))
        return RingSpec(capacity, tuple(fields))

    def layout(self) -> Layout:
        counters = [(name, (8,), "<i8") for name in ("head", "tail", "ep_head", "ep_tail")]
        rows = [(name, (self.capacity, *shape), dtype) for name, shape, dtype in self.fields]
        origin = [(name, (self.capacity,), "<i8") for name in (*ORIGIN_FIELDS, "policy")]
        episodes = [
            ("returns", (self.episodes,), "<f8"),
            ("lengths", (self.episodes,), "<i8"),
            ("ep_policy", (self.episodes,), "<i8"),
        ]
        return (*counters, *rows, *origin, *episodes)


class UnrollRing(SharedArrays):
    """One frontend's finished unrolls and ended episodes on their way to the model's store.

    One writer (the frontend) and one reader (the drain). ``head`` counts what was
    committed, ``tail`` what was taken; a writer writes rows past ``head`` and moves it
    after them, so a reader never sees a half-written unroll, and one that died mid-write
    left only rows past ``head`` that the next writer overwrites.
    """

    def __init__(self, spec: RingSpec, name: str | None = None) -> None:
        super().__init__(spec.layout(), name)
        self.spec = spec
        self._states = sum(1 for name, _, _ in spec.fields if name.startswith("core_state"))
        self.last_origin: tuple[np.ndarray, np.ndarray] = (np.zeros(0, np.int64),) * 2
        """The writer's builder slot and slot-unroll number of each unroll the last
        :meth:`read` returned."""
        self.last_policy = NO_POLICIES
        """The policy (by index, --policy-mapping) of each unroll the last :meth:`read`
        returned."""
        self.last_episode_policy = NO_POLICIES
        """The policy of each episode the last :meth:`read_episodes` returned."""

    def _counter(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def write(
        self,
        unrolls: Unrolls,
        origin: tuple[np.ndarray, np.ndarray],
        policy_N: np.ndarray | None = None,
    ) -> int:
        """Commit as many of ``unrolls`` as there is room for, with their ``origin`` (the
        builder's ``last_origin`` when it returned them) and policies (None: all the one
        policy's); how many."""
        head_c, tail_c = self._counter("head"), self._counter("tail")
        head = int(head_c[0])
        n = min(len(unrolls), self.spec.capacity - (head - int(tail_c[0])))
        if n <= 0:
            return 0
        at_N = (head + np.arange(n)) % self.spec.capacity
        for name, _, _ in self.spec.fields:
            self.arrays[name][at_N] = self._field(unrolls, name)[:n]
        for name, values_N in zip(ORIGIN_FIELDS, origin, strict=True):
            self.arrays[name][at_N] = values_N[:n]
        self.arrays["policy"][at_N] = 0 if policy_N is None else policy_N[:n]
        head_c[0] = head + n  # last: the rows are whole once it moves
        return n

    def committed(self) -> int:
        """Unrolls committed and not taken yet."""
        return int(self._counter("head")[0]) - int(self._counter("tail")[0])

    def read(self) -> Unrolls | None:
        """Every committed unroll not taken yet (copies), now taken, their origins in
        :attr:`last_origin`; None if none."""
        head_c, tail_c = self._counter("head"), self._counter("tail")
        head, tail = int(head_c[0]), int(tail_c[0])
        if head == tail:
            return None
        at_N = (tail + np.arange(head - tail)) % self.spec.capacity
        taken = {name: self.arrays[name][at_N] for name, _, _ in self.spec.fields}
        self.last_origin = (self.arrays["origin_slot"][at_N], self.arrays["origin_index"][at_N])
        self.last_policy = self.arrays["policy"][at_N]
        tail_c[0] = head
        return Unrolls(
            obs=taken["obs"], first=taken["first"], reward=taken["reward"],
            terminated=taken["terminated"], truncated=taken["truncated"],
            action=taken["action"], policy_params=taken["policy_params"],
            core_state=tuple(taken[f"core_state{i}"] for i in range(self._states)),
            acted_step=taken["acted_step"], running_return=taken.get("running_return"),
        )  # fmt: skip

    def write_episodes(self, episodes: FinishedEpisodes, policy_E: np.ndarray | None = None) -> int:
        """Commit as many ended episodes as there is room for, with their policies (None:
        the one policy's); how many."""
        head_c, tail_c = self._counter("ep_head"), self._counter("ep_tail")
        head = int(head_c[0])
        n = min(len(episodes.returns), self.spec.episodes - (head - int(tail_c[0])))
        if n <= 0:
            return 0
        at_E = (head + np.arange(n)) % self.spec.episodes
        self.arrays["returns"][at_E] = episodes.returns[:n]
        self.arrays["lengths"][at_E] = episodes.lengths[:n]
        self.arrays["ep_policy"][at_E] = 0 if policy_E is None else policy_E[:n]
        head_c[0] = head + n
        return n

    def read_episodes(self) -> FinishedEpisodes | None:
        head_c, tail_c = self._counter("ep_head"), self._counter("ep_tail")
        head, tail = int(head_c[0]), int(tail_c[0])
        if head == tail:
            return None
        at_E = (tail + np.arange(head - tail)) % self.spec.episodes
        episodes = FinishedEpisodes(self.arrays["returns"][at_E], self.arrays["lengths"][at_E])
        self.last_episode_policy = self.arrays["ep_policy"][at_E]
        tail_c[0] = head
        return episodes

    @staticmethod
    def _field(unrolls: Unrolls, name: str) -> np.ndarray:
        if name.startswith("core_state"):
            return unrolls.core_state[int(name.removeprefix("core_state"))]
        value = getattr(unrolls, name)
        assert value is not None
        return value


# ---------------------------------------------------------------------- frontend side


@dataclass
class FrontendUnrolls:
    """What a spawned frontend needs to build its streams' unrolls (pickled with the spawn)."""

    layout: dict[str, Any]
    """The learner's builder's arguments (:meth:`TrajectoryBuilder.layout`)."""
    reply: ReplySpec
    reply_name: str
    ring: RingSpec
    ring_name: str
    drain_bell: InheritedFd | int | None = None
    """The model's drain thread's doorbell (an int descriptor once in the frontend)."""

    def attach(self, table: SlotTable) -> FrontendTrajectories:
        assert not isinstance(self.drain_bell, InheritedFd)  # unpickled in the frontend
        return FrontendTrajectories(
            TrajectoryBuilder(**self.layout),
            table,
            ReplyRows(self.reply, self.reply_name),
            UnrollRing(self.ring, self.ring_name),
            self.drain_bell,
        )


class FrontendTrajectories:
    """A frontend's trajectory builder over the rows the model answered, and its ring."""

    def __init__(
        self,
        builder: TrajectoryBuilder,
        table: SlotTable,
        reply: ReplyRows,
        ring: UnrollRing,
        drain_bell: int | None = None,
    ) -> None:
        self.builder = builder
        self.reply = reply
        self.ring = ring
        self.drain_bell = drain_bell
        """Rung when a write leaves half the ring committed (None: the drain's period only)."""
        self.policy_S = np.zeros(0, np.int64)
        """With several policies, each builder slot's: the one its last row was played by
        (``UNPLAYED`` before its first), its unrolls' and episodes' policy."""
        rows = table.spec.rows
        self.obs_RO: np.ndarray | None = None
        if reply.seen_RO is None:  # the frames as written are what the policy saw
            self.obs_RO = table.obs_bytes.view(builder.obs_dtype).reshape(
                rows, *builder.frame_shape
            )
        self.reward_R = table.reward_bytes.view(np.float32)
        self.terminated_R = table.terminated_bytes.view(np.bool_)
        self.truncated_R = table.truncated_bytes.view(np.bool_)
        self.action_RA = table.action_RA
        self._unrolls: list[tuple[Unrolls, tuple[np.ndarray, np.ndarray], np.ndarray | None]] = []
        """Unrolls (with their origin and policies) the ring had no room for yet, oldest first."""
        self._episodes: list[tuple[FinishedEpisodes, np.ndarray | None]] = []
        """Episodes (with their policies) the ring had no room for yet, oldest first."""

    def open(self, count: int) -> np.ndarray:
        """Fresh builder slots for a new stream's ``count`` envs (its agents' rows)."""
        ids = self.builder.allocate(count)
        if self.reply.policy_R is not None:
            if len(self.policy_S) < self.builder.capacity:  # the builder grew its slots
                grown = np.full(self.builder.capacity, UNPLAYED, np.int64)
                grown[: len(self.policy_S)] = self.policy_S
                self.policy_S = grown
            self.policy_S[ids] = UNPLAYED
        return ids

    def close(self, slot_S: np.ndarray) -> None:
        """A closed stream's slots back; their partial unrolls are dropped (the model
        counts them in ``frames_dropped``)."""
        self.builder.release(slot_S)

    def record(self, slot_B: np.ndarray, row_B: np.ndarray) -> None:
        """Append the answered rows ``row_B`` (of table rows) to builder slots ``slot_B``
        (of a multi-agent env, only those the model recorded, with its credited rewards);
        unrolls and episodes that ended go to the ring."""
        builder, reply = self.builder, self.reply
        reward_R = self.reward_R
        if reply.recorded_R is not None:
            kept_B = reply.recorded_R[row_B]
            slot_B, row_B = slot_B[kept_B], row_B[kept_B]
            assert reply.reward_R is not None
            reward_R = reply.reward_R
            if not len(row_B):  # only waiting agents and opponents this time
                return
        several = reply.policy_R is not None
        if several:
            self._played_by(slot_B, row_B)
        obs_BO = reply.seen_RO[row_B] if self.obs_RO is None else self.obs_RO[row_B]  # type: ignore[index]
        first_B = reply.first_R[row_B]
        if builder.frame_stack > 1:  # its ring gives a full unroll's first stack
            builder.stack_frames(slot_B, obs_BO, first_B)
        before = tuple(s[row_B] for s in reply.state_RH)
        unrolls, episodes = builder.record(
            slot_B, obs_BO, reward_R[row_B], self.terminated_R[row_B],
            self.truncated_R[row_B], first_B, self.action_RA[row_B], reply.params_RP[row_B],
            before, before, reply.step_R[row_B],
        )  # fmt: skip
        if unrolls is not None:
            origin = builder.last_origin
            self._unrolls.append((unrolls, origin, self.policy_S[origin[0]] if several else None))
        if episodes is not None:  # the builder ends them in the order of the rows that end
            ended_E = slot_B[self.terminated_R[row_B] | self.truncated_R[row_B]]
            self._episodes.append((episodes, self.policy_S[ended_E] if several else None))
        if unrolls is not None or episodes is not None:
            self.flush()

    def _played_by(self, slot_B: np.ndarray, row_B: np.ndarray) -> None:
        """Each slot's policy from the rows' reply. A slot played by another policy than
        its last row's was moved by the model to another population member as its
        episode ended: it starts afresh, its partial unroll dropped as the model's was."""
        assert self.reply.policy_R is not None
        policy_B = self.reply.policy_R[row_B]
        last_B = self.policy_S[slot_B]
        moved_B = (policy_B != last_B) & (last_B != UNPLAYED)
        if moved_B.any():
            self.builder.restart(slot_B[moved_B])
        self.policy_S[slot_B] = policy_B

    def flush(self) -> None:
        """Into the ring what fits, oldest first; the drain rung once half the ring waits."""
        wrote = 0
        while self._unrolls:
            head, (slot_N, index_N), policy_N = self._unrolls[0]
            n = self.ring.write(head, (slot_N, index_N), policy_N)
            wrote += n
            if n < len(head):
                rest = None if policy_N is None else policy_N[n:]
                self._unrolls[0] = (head.split(n)[1], (slot_N[n:], index_N[n:]), rest)
                break
            self._unrolls.pop(0)
        half = 2 * self.ring.committed() >= self.ring.spec.capacity
        if wrote and half and self.drain_bell is not None:
            ring(self.drain_bell)
        while self._episodes:
            head_e, policy_E = self._episodes[0]
            n = self.ring.write_episodes(head_e, policy_E)
            if n < len(head_e.returns):
                rest = None if policy_E is None else policy_E[n:]
                self._episodes[0] = (FinishedEpisodes(head_e.returns[n:], head_e.lengths[n:]), rest)
                break
            self._episodes.pop(0)

    @property
    def backlog(self) -> bool:
        """Unrolls or episodes wait for room in the ring: the trainer is behind."""
        return bool(self._unrolls or self._episodes)

    async def room(self, closing: Callable[[], bool]) -> None:
        """Until the ring took the backlog (the frontend's streams wait: back-pressure) or
        the frontend is ``closing`` (the run ends: the trainer that would make room may
        have stopped already, and a stream waiting here must end with the others)."""
        while self.backlog and not closing():
            self.flush()
            if self.backlog:
                await asyncio.sleep(ROOM_POLL_S)


# ---------------------------------------------------------------------- model side


class UnrollDrain:
    """A thread of the model process: every ring's committed unrolls into the learner's
    store (and offered to the dataset recorder), its ended episodes into the stats (on
    the event loop, which owns them). ``rings[i]`` is frontend i's."""

    def __init__(
        self,
        rings: list[UnrollRing],
        store: Store,
        keep_unrolls: bool,
        stats: LearnerStats,
        recorder: EpisodeRecorder | None = None,
        counts_episodes: bool = True,
        policies: Sequence[tuple[Store, LearnerStats | None]] | None = None,
    ) -> None:
        self.rings = rings
        self.policies = None if policies is None else list(policies)
        """With --policy-mapping, each policy's store and stats by its index: an unroll
        goes to its policy's store alone, an episode to its stats besides the learner's."""
        self.counts_episodes = counts_episodes
        """False where the model process ends the episodes itself (:class:`ModelRows`
        with self-play): the rings' episodes are taken and dropped, so none counts twice."""
        self.store = store
        self.keep_unrolls = keep_unrolls
        """False with --no-train: nothing consumes unrolls; the rings are still emptied."""
        self.stats = stats
        self.recorder = recorder
        """With --record-dataset: offered every unroll with its slot numbered apart from
        other frontends' (it never waits)."""
        self.bell = new_doorbell()
        """Frontends ring it when half their ring waits; the drain reads it or its period ends."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="unroll-drain", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float | None = None) -> bool:
        """Take what is left and end the thread; whether it ended within ``timeout_s``."""
        self._stop.set()
        ring(self.bell)
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                return False
        with contextlib.suppress(OSError):
            os.close(self.bell)
        return True

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self.bell, select.POLLIN)
        while True:
            poller.poll(DRAIN_PERIOD_S * 1000)
            drain(self.bell)
            if self._stop.is_set():
                break
            for index in range(len(self.rings)):
                self.take(index)
        for index in range(len(self.rings)):  # what the stopped frontends committed last
            self.take(index)

    def take(self, index: int) -> None:
        """Frontend ``index``'s committed episodes and unrolls, waiting while the store is
        full."""
        unroll_ring = self.rings[index]
        episodes = unroll_ring.read_episodes()
        if episodes is not None and self._loop is not None and self.counts_episodes:
            policy_E = unroll_ring.last_episode_policy.copy()
            with contextlib.suppress(RuntimeError):  # the loop closed: the run is over
                self._loop.call_soon_threadsafe(self._count, episodes, policy_E)
        unrolls = unroll_ring.read()
        if unrolls is not None and self.recorder is not None:
            slot_N, count_N = unroll_ring.last_origin
            self.recorder.offer(unrolls, index * FRONTEND_SLOTS + slot_N, count_N)
        if unrolls is None or not self.keep_unrolls:
            return
        if self.policies is None:
            self._put(self.store, unrolls)
            return
        policy_N = unroll_ring.last_policy
        for policy in np.unique(policy_N).tolist():
            self._put(self.policies[policy][0], unrolls.select(np.flatnonzero(policy_N == policy)))

    def _put(self, store: Store, unrolls: Unrolls) -> None:
        """Into ``store``, waiting while it is full (back-pressure) unless stopping."""
        while not store.put(unrolls, timeout=DRAIN_PERIOD_S):
            if self._stop.is_set() or store.has_room():  # stopping, or the store closed
                return

    def _count(self, episodes: FinishedEpisodes, policy_E: np.ndarray) -> None:
        """Episodes into the learner's stats and, with several policies, each into its
        policy's (on the event loop, which owns the stats)."""
        self.stats.on_episodes(episodes)
        if self.policies is None:
            return
        for policy in np.unique(policy_E).tolist():
            stats = self.policies[policy][1]
            if stats is not None:
                at = np.flatnonzero(policy_E == policy)
                stats.on_episodes(FinishedEpisodes(episodes.returns[at], episodes.lengths[at]))
