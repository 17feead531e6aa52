"""The learner's hot loop over actors' streams: one closed batch -> one forward pass -> replies.

``InferenceEngine.process`` runs on the event loop for every batch the
:class:`~learner.serving.batcher.DynamicBatcher` closes: gather the K frames of each pending
stream into one array per field, fail the streams whose frames hold NaN or inf, serve the
rows (:meth:`~learner.serving.rows.ServingCore.serve`: who plays each row, recurrent state
and frame stacks per slot, the policy, the trajectories), answer every stream, and hand
finished unrolls to the trainer (waiting when its queue is full: back-pressure).

Shape suffixes: B frames in the batch, A action dims.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import numpy as np

from learner.agents.base import Store
from learner.agents.policy import Policy
from learner.population.assignment import MemberSlots
from learner.serving.batcher import PendingRequest
from learner.serving.rows import FrameBatch, ServedPolicy, ServingCore
from learner.serving.streams import Connection, FramePayload, stream_policies
from learner.state.counters import StepCounter
from learner.state.normalize import Normalizer
from learner.state.stats import LearnerStats
from learner.state.trajectories import TrajectoryBuilder, Unrolls
from seedrl.codec import WireError, all_finite

if TYPE_CHECKING:  # the league's modules load only for --self-play
    from learner.serving.selfplay import SelfPlay
    from learner.state.dataset import EpisodeRecorder


def gather_frames(
    frames: list[FramePayload], obs_dtype: np.dtype, obs_shape: tuple[int, ...]
) -> FrameBatch:
    """Join the frames' bytes into one array per field (the observations writable, for torch)."""
    return FrameBatch(
        slot_B=np.frombuffer(b"".join([f.conn.slot_bytes for f in frames]), np.int64),
        obs_BO=np.frombuffer(bytearray().join([f.observations for f in frames]), obs_dtype).reshape(
            -1, *obs_shape
        ),
        reward_B=np.frombuffer(b"".join([f.rewards for f in frames]), np.float32),
        terminated_B=np.frombuffer(b"".join([f.terminated for f in frames]), np.bool_),
        truncated_B=np.frombuffer(b"".join([f.truncated for f in frames]), np.bool_),
        acting_B=(
            None if frames[0].acting is None
            else np.frombuffer(b"".join([f.acting for f in frames]), np.bool_)  # type: ignore[misc]
        ),
    )  # fmt: skip


def nonfinite_problem(batch: FrameBatch) -> str | None:
    """Why a batch (or one frame) cannot be used: NaN or inf in observations or rewards."""
    if not all_finite(batch.obs_BO):
        return "observations: contains NaN or inf"
    if not all_finite(batch.reward_B):
        return "rewards: contains NaN or inf"
    return None


def policy_rows(live: list[PendingRequest], agent_policy_A: np.ndarray | None) -> np.ndarray | None:
    """Each row's policy, by its index (None: one policy plays every row), stream by
    stream (:func:`~learner.serving.streams.stream_policies`)."""
    if agent_policy_A is None:
        return None
    return np.concatenate([stream_policies(agent_policy_A, r.payload.conn.num_envs) for r in live])


class InferenceEngine(ServingCore):
    """Serves batches of actors' frames with the serving core and answers their streams."""

    def __init__(
        self,
        policy: Policy,
        builder: TrajectoryBuilder,
        queue: Store,
        stats: LearnerStats,
        weights_lock: AbstractContextManager[Any],
        learner_step: StepCounter,
        keep_unrolls: bool = True,
        refresh_weights: Callable[[], None] | None = None,
        normalizer: Normalizer | None = None,
        self_play: SelfPlay | None = None,
        recorder: EpisodeRecorder | None = None,
        policies: list[tuple[ServedPolicy, Store]] | None = None,
        agent_policy: np.ndarray | None = None,
        members: MemberSlots | None = None,
    ) -> None:
        """``policy`` is the agent's action choice over the weights inference runs
        (``Agent.inference_policy``); ``weights_lock`` is held around each forward pass.
        ``policies``, ``agent_policy``: a multi-agent env's several trained policies, each
        with the store its unrolls go to (in place of ``policy`` and ``queue``), and each
        agent's index among them; ``members``: with a population (--population), each slot's
        member, whose policy ``policies`` holds at its index."""
        super().__init__(
            policy, builder, stats, weights_lock, learner_step, refresh_weights, normalizer,
            self_play, [served for served, _ in policies] if policies else None,
        )  # fmt: skip
        self.stores = [store for _, store in policies] if policies else [queue]
        """Each policy's store, by its index among the core's policies."""
        self.agent_policy = agent_policy
        self.members = members
        self._obs_dtype = builder.obs_dtype if normalizer is None else normalizer.obs_dtype
        self._frame_shape = builder.frame_shape if normalizer is None else normalizer.obs_shape
        """What frames carry: the raw observation, which normalisation may widen (a float64
        leaf of packed rows becomes float32, a flat one keeps its shape)."""
        self.queue = queue
        self._released: list[np.ndarray] = []
        self.keep_unrolls = keep_unrolls
        """False with --no-train: nobody consumes unrolls, so they are not queued."""
        self.recorder = recorder
        """With --record-dataset: offered every batch's finished unrolls (it never waits)."""

    def release_later(self, conn: Connection) -> None:
        """Free a closed stream's slots between batches, never under a batch in flight."""
        conn.closed = True
        self._released.append(conn.slot_ids)

    def _release_closed(self) -> None:
        while self._released:
            slots = self._released.pop()
            lost = self.builder.release(slots)
            self.stats.frames_dropped += lost
            if self.members is not None:
                self.members.release(slots)

    def begin_batch(self) -> None:
        """A batch the caller gathers itself (the serving tier's slot table) begins: its
        phases are timed from here, and closed streams' slots are freed first."""
        begin, _ = self._phase_marks
        begin()
        self._release_closed()

    def serve_rows(
        self, rows: FrameBatch, policy_B: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Every row's action and the policy that played it (None: the one policy played
        them all), for a batch whose caller answers the rows and whose unrolls are built
        elsewhere (the serving tier's frontends); ``policy_B``: each row's policy with
        --policy-mapping (a population's members are this engine's to assign)."""
        if self.members is not None:
            policy_B = self.members.members_of(rows.slot_B)
        action_BA, _ = self.serve_policies(rows, None, policy_B)
        self._move_members(rows)
        return action_BA, policy_B

    def _move_members(self, rows: FrameBatch) -> None:
        """A population's slots promised to another member move as their episode ends."""
        if self.members is not None:
            moved = self.members.moves_due(rows.slot_B, rows.terminated_B | rows.truncated_B)
            self.stats.frames_dropped += self.builder.restart(moved)

    async def process(self, batch: list[PendingRequest]) -> None:
        begin, mark = self._phase_marks  # each mark ends a phase (--time-phases)
        begin()
        self._release_closed()
        live = [r for r in batch if not r.payload.conn.closed]
        if not live:
            return
        rows = self._gather(live)
        if nonfinite_problem(rows) is not None:  # one check per batch; the search is rare
            live = self._reject_nonfinite(live)
            if not live:
                return
            rows = self._gather(live)
        if self.members is None:
            policy_B = policy_rows(live, self.agent_policy)
        else:
            policy_B = self.members.members_of(rows.slot_B)
        action_BA, handoffs = self.serve_policies(rows, self._fresh_slots(live), policy_B)
        self._move_members(rows)
        self._reply(live, action_BA)
        mark("reply")
        for handoff in handoffs:  # each policy's unrolls to its own store only
            await self._hand_over(
                handoff.unrolls, mark, self.stores[handoff.policy], handoff.origin
            )

    def _fresh_slots(self, live: list[PendingRequest]) -> np.ndarray | None:
        """With self-play, the slots of streams that send their first frame: their envs
        start afresh (the slots may have served a game of another stream)."""
        if self.self_play is None:
            return None
        fresh = [r.payload.conn.slot_ids for r in live if r.payload.conn.frames == 0]
        return np.concatenate(fresh) if fresh else None

    @staticmethod
    def _reply(live: list[PendingRequest], action_BA: np.ndarray) -> None:
        """Each stream's K rows of the batch's actions, in the order they were gathered."""
        offset = 0
        for request in live:
            conn = request.payload.conn
            k = conn.num_envs
            conn.frames += k
            if not request.future.done():
                request.future.set_result(action_BA[offset : offset + k])
            offset += k

    async def _hand_over(
        self,
        unrolls: Unrolls | None,
        mark: Callable[[str], None],
        queue: Store | None = None,
        origin: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """Finished unrolls to the trainer's store (``queue``: one policy's), waiting while
        it is full; ``origin``: their slots and unroll counts (default: the builder's last)."""
        queue = self.queue if queue is None else queue
        if unrolls is not None and self.recorder is not None:
            self.recorder.offer(unrolls, *(origin or self.builder.last_origin))
        if unrolls is not None and self.keep_unrolls:
            if queue.has_room():
                queue.put(unrolls)
                mark("trainer_handoff")
            else:  # back-pressure: the wait is inference_wait_trainer, not a phase
                with self.stats.timer("inference_wait_trainer"):
                    await asyncio.to_thread(queue.put, unrolls)

    def _gather(self, requests: list[PendingRequest]) -> FrameBatch:
        return gather_frames([r.payload for r in requests], self._obs_dtype, self._frame_shape)

    def _reject_nonfinite(self, batch: list[PendingRequest]) -> list[PendingRequest]:
        """Fail the requests whose frames hold NaN/inf (their streams end); keep the rest."""
        kept: list[PendingRequest] = []
        for request in batch:
            problem = nonfinite_problem(self._gather([request]))
            if problem is None:
                kept.append(request)
            elif not request.future.done():
                request.future.set_exception(WireError(problem))
        return kept
