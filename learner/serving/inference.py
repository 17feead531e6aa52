"""The learner's hot loop: one closed batch -> one forward pass -> actions back.

``InferenceEngine.process`` runs on the event loop for every batch the
:class:`~learner.serving.batcher.DynamicBatcher` closes: gather the K frames of each pending
stream into one array, read each slot's recurrent state, run the policy once
(the agent's policy, e.g. :mod:`learner.agents.policy`) to get
actions (with frame stacking, on each slot's stack with the new frame pushed on),
record the frames into the trajectory builder, answer every stream, and hand
finished unrolls to the trainer (waiting when its queue is full: back-pressure).

Shape suffixes: B frames in the batch, O observation dims, A action dims, P policy
parameters, H core state size.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from learner.agents.base import Store
from learner.agents.policy import Policy
from learner.serving.batcher import PendingRequest
from learner.state.counters import StepCounter
from learner.state.normalize import Normalizer
from learner.state.stats import LearnerStats
from learner.state.trajectories import FinishedEpisodes, TrajectoryBuilder, Unrolls
from seedrl.codec import WireError, all_finite

if TYPE_CHECKING:  # the league's modules load only for --self-play
    from learner.serving.selfplay import SelfPlay
    from learner.state.dataset import EpisodeRecorder


@dataclass(eq=False)
class Connection:
    """One admitted actor stream and the trajectory slots of its K envs."""

    actor_id: str
    run_id: str
    peer: str
    num_envs: int
    slot_ids: np.ndarray
    newest_frame_only: bool = False
    """The stream sends only the newest frame of each stacked observation."""
    frames: int = 0
    closed: bool = False
    slot_bytes: bytes = field(init=False, repr=False)
    """``slot_ids`` as int64 bytes: a batch joins them (many tiny arrays concatenate slowly)."""

    def __post_init__(self) -> None:
        self.slot_bytes = np.ascontiguousarray(self.slot_ids, np.int64).tobytes()


class FramePayload:
    """One stream's frame as the raw bytes of its four tensors, already checked for layout.

    Arrays are built once per batch (one ``frombuffer`` per field for all streams), not
    per frame: at K = 1 that was most of the learner's Python per message.
    """

    __slots__ = ("acting", "conn", "observations", "rewards", "terminated", "truncated")

    def __init__(
        self,
        conn: Connection,
        observations: bytes,
        rewards: bytes,
        terminated: bytes,
        truncated: bytes,
        acting: bytes | None = None,
    ) -> None:
        self.conn = conn
        self.observations = observations
        self.rewards = rewards
        self.terminated = terminated
        self.truncated = truncated
        self.acting = acting
        """A multi-agent env's acting rows (bool bytes); None for a single-agent env."""


@dataclass
class FrameBatch:
    """The frames of one forward pass as arrays, B rows in stream order."""

    slot_B: np.ndarray
    obs_BO: np.ndarray
    reward_B: np.ndarray
    terminated_B: np.ndarray
    truncated_B: np.ndarray
    acting_B: np.ndarray | None = None
    """A multi-agent env's rows that act; None for a single-agent env (all act)."""


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


@dataclass
class ServedPolicy:
    """One of several trained policies as inference serves it: its action choice, the
    lock and step of its weights, the store its unrolls go to, and its own stats."""

    policy: Policy
    queue: Store
    weights_lock: AbstractContextManager[Any]
    learner_step: StepCounter
    stats: LearnerStats | None = None
    """Its own agents' frames and episodes (None: only the learner's stats count them)."""
    refresh_weights: Callable[[], None] | None = None


def policy_groups(
    live: list[PendingRequest], rows_L: np.ndarray, agent_policy_A: np.ndarray | None
) -> list[tuple[int, np.ndarray]]:
    """The batch rows ``rows_L`` grouped by the policy that plays them, (policy index,
    rows) per policy with rows: a stream's rows come env by env, so row ``i * A + j`` of
    a stream is agent j's (None: one policy plays every agent)."""
    if agent_policy_A is None:
        return [(0, rows_L)]
    agents = len(agent_policy_A)
    policy_B = np.concatenate(
        [np.tile(agent_policy_A, r.payload.conn.num_envs // agents) for r in live]
    )
    policy_L = policy_B[rows_L]
    return [(p, rows_L[policy_L == p]) for p in np.unique(policy_L).tolist()]


def joined_episodes(ended: list[FinishedEpisodes]) -> FinishedEpisodes | None:
    """The episodes several policies' rows ended in one batch, as one record."""
    if len(ended) <= 1:
        return ended[0] if ended else None
    return FinishedEpisodes(
        returns=np.concatenate([e.returns for e in ended]),
        lengths=np.concatenate([e.lengths for e in ended]),
    )


class InferenceEngine:
    """Runs the agent's policy for batches of frames, on the weights training updates."""

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
        policies: list[ServedPolicy] | None = None,
        agent_policy: np.ndarray | None = None,
    ) -> None:
        """``policy`` is the agent's action choice over the weights inference runs
        (``Agent.inference_policy``); ``weights_lock`` is held around each forward pass.
        ``policies``, ``agent_policy``: a multi-agent env's trained policies (each with
        its own weights and store, in place of ``policy`` and ``queue``), and each
        agent's index among them."""
        self.policy = policy
        self.normalizer = normalizer
        """With --normalize-observations: updated with, then applied to, every batch; the
        builder then stores the normalized float32 frames the policy acted on."""
        self._obs_dtype = builder.obs_dtype if normalizer is None else normalizer.obs_dtype
        self._frame_shape = builder.frame_shape if normalizer is None else normalizer.obs_shape
        """What frames carry: the raw observation, which normalisation may widen (a float64
        leaf of packed rows becomes float32, a flat one keeps its shape)."""
        self.builder = builder
        self.queue = queue
        self.stats = stats
        self.weights_lock = weights_lock
        self.learner_step = learner_step
        self._released: list[np.ndarray] = []
        self.keep_unrolls = keep_unrolls
        """False with --no-train: nobody consumes unrolls, so they are not queued."""
        self.refresh_weights = refresh_weights
        """Called before each forward pass when training runs on other weights (the trainer
        process, the device trainer)."""
        self._phase_marks = stats.phase_marks()
        self.self_play = self_play
        """Two-player games with --self-play: seats, opponents and results."""
        self.recorder = recorder
        """With --record-dataset: offered every batch's finished unrolls (it never waits)."""
        self.served = policies or [
            ServedPolicy(policy, queue, weights_lock, learner_step, None, refresh_weights)
        ]
        """Every policy rows are grouped by (one: ``policy`` over ``queue``)."""
        self.agent_policy = agent_policy

    def release_later(self, conn: Connection) -> None:
        """Free a closed stream's slots between batches, never under a batch in flight."""
        conn.closed = True
        self._released.append(conn.slot_ids)

    def _release_closed(self) -> None:
        while self._released:
            lost = self.builder.release(self._released.pop())
            self.stats.frames_dropped += lost

    async def process(self, batch: list[PendingRequest]) -> None:
        begin, mark = self._phase_marks  # each mark ends a phase (--time-phases)
        begin()
        self._release_closed()
        live = [r for r in batch if not r.payload.conn.closed]
        if not live:
            return
        fb = self._gather(live)
        if nonfinite_problem(fb) is not None:  # one check per batch; the search is rare
            live = self._reject_nonfinite(live)
            if not live:
                return
            fb = self._gather(live)
        if fb.acting_B is not None:
            await self._process_agents(live, fb)
            return
        first_B = self.builder.first_flags(fb.slot_B)
        if self.refresh_weights is not None:
            mark("batch_assembly")
            self.refresh_weights()
            mark("trainer_handoff")

        obs_BO = fb.obs_BO
        if self.builder.frame_stack > 1:
            obs_BO = self.builder.stack_frames(fb.slot_B, fb.obs_BO, first_B)
        if self.normalizer is not None:
            self.normalizer.update(obs_BO)
            obs_BO = self.normalizer.normalize(obs_BO)
        mark("batch_assembly")

        action_BA, params_BP, state_before, state_after, step = self._policy(
            fb.slot_B, obs_BO, first_B
        )
        mark("forward")
        # With frame stacking the builder keeps the newest frames (stacking is off when the
        # learner normalizes), else what the policy saw.
        stored_BO = fb.obs_BO if self.builder.frame_stack > 1 else obs_BO
        unrolls, episodes = self.builder.record(
            fb.slot_B, stored_BO, fb.reward_B, fb.terminated_B, fb.truncated_B, first_B,
            action_BA, params_BP, state_before, state_after, step,
        )  # fmt: skip
        self.stats.on_batch(len(fb.slot_B), episodes)
        mark("trajectory_write")

        self._reply(live, action_BA)
        mark("reply")
        await self._hand_over(unrolls, mark)

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
        """Finished unrolls to the trainer's store (``queue``: a policy's own), waiting
        while it is full; ``origin``: their slots and unroll counts (default: the
        builder's last ones)."""
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

    async def _process_agents(self, live: list[PendingRequest], fb: FrameBatch) -> None:
        """A multi-agent env's batch: only rows that act or end reach a policy, only the
        learning policy's reach the trajectories; waiting rows add their reward to their
        slot's next step (``TrajectoryBuilder.credit_waits``), and get action 0. With
        several policies each one's rows get one forward pass on its weights, and their
        unrolls go to its store alone (:func:`policy_groups`)."""
        _, mark = self._phase_marks
        acting_B = fb.acting_B
        assert acting_B is not None
        slot_B, done_B = fb.slot_B, fb.terminated_B | fb.truncated_B
        step_B = acting_B | done_B
        reward_B = self.builder.credit_waits(slot_B, fb.reward_B, step_B)
        learner_B, opponent_B = step_B, None
        if self.self_play is not None:
            self.self_play.snapshot_due(self.learner_step.value)  # the first one at once
            for request in live:
                if request.payload.conn.frames == 0:  # a new stream: its envs start afresh
                    self.self_play.reset(request.payload.conn.slot_ids)
            seat_B, opponent_B = self.self_play.seats(slot_B, acting_B, done_B)
            learner_B = step_B & seat_B
        groups = policy_groups(live, np.flatnonzero(learner_B), self.agent_policy)
        for served in self.served:
            if served.refresh_weights is not None:
                served.refresh_weights()
        obs_BO = fb.obs_BO
        if self.normalizer is not None:
            self.normalizer.update(obs_BO[step_B])
            obs_BO = self.normalizer.normalize(obs_BO)
        mark("batch_assembly")
        action_BA = np.zeros((len(slot_B), *self.builder.action_shape), self.builder.action_dtype)
        acted = []  # one forward pass per policy with rows in the batch
        for index, rows in groups:
            served, slots = self.served[index], slot_B[rows]
            first_L = self.builder.first_flags(slots)
            forward = self._policy(slots, obs_BO[rows], first_L, served) if len(rows) else None
            if forward is not None:
                action_BA[rows] = forward[0]
            acted.append((served, rows, first_L, forward))
        if self.self_play is not None:
            assert opponent_B is not None
            opponents_B = acting_B & ~done_B & ~learner_B  # an ended agent's action is unused
            self.self_play.act(obs_BO, fb.obs_BO, slot_B, opponent_B, action_BA, opponents_B)
        mark("forward")
        handed, ended = [], []
        for served, rows, first_L, forward in acted:
            episodes = None
            if forward is not None:
                reward_L = np.where(first_L, np.float32(0.0), reward_B[rows])  # none before a start
                unrolls, episodes = self.builder.record(
                    slot_B[rows], obs_BO[rows], reward_L, fb.terminated_B[rows],
                    fb.truncated_B[rows], first_L, *forward,
                )  # fmt: skip
                handed.append((unrolls, served.queue, self.builder.last_origin))
                if episodes is not None and self.self_play is not None:
                    self.self_play.finish(rows[done_B[rows]], episodes.returns)
            if episodes is not None:
                ended.append(episodes)
            if served.stats is not None:
                served.stats.on_batch(len(rows), episodes)
        self.stats.on_batch(int(learner_B.sum()), joined_episodes(ended))
        mark("trajectory_write")
        self._reply(live, action_BA)
        mark("reply")
        for unrolls, queue, origin in handed:  # each policy's own, after every reply
            await self._hand_over(unrolls, mark, queue, origin)

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

    def _policy(
        self,
        slot_B: np.ndarray,
        obs_BO: np.ndarray,
        first_B: np.ndarray,
        served: ServedPolicy | None = None,
    ):
        """One forward pass with T = 1 (of ``served``, default the first policy): numpy
        actions, params, core states and the learner step of the weights that ran it (read
        under the lock: a trainer thread's step lands between two forward passes, never
        between a pass and its step number)."""
        served = self.served[0] if served is None else served
        state_before = tuple(s[slot_B] for s in self.builder.core_state_SH)
        with served.weights_lock:
            action_BA, params_BP, state_after = served.policy(obs_BO, first_B, state_before, slot_B)
            step = served.learner_step.value
        return action_BA, params_BP, state_before, state_after, step
