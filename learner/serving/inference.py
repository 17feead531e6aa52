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
from learner.state.trajectories import TrajectoryBuilder, Unrolls
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
    ) -> None:
        """``policy`` is the agent's action choice over the weights inference runs
        (``Agent.inference_policy``); ``weights_lock`` is held around each forward pass."""
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

    async def _hand_over(self, unrolls: Unrolls | None, mark: Callable[[str], None]) -> None:
        """Finished unrolls to the trainer's store, waiting while it is full."""
        if unrolls is not None and self.recorder is not None:
            self.recorder.offer(unrolls, *self.builder.last_origin)
        if unrolls is not None and self.keep_unrolls:
            if self.queue.has_room():
                self.queue.put(unrolls)
                mark("trainer_handoff")
            else:  # back-pressure: the wait is inference_wait_trainer, not a phase
                with self.stats.timer("inference_wait_trainer"):
                    await asyncio.to_thread(self.queue.put, unrolls)

    async def _process_agents(self, live: list[PendingRequest], fb: FrameBatch) -> None:
        """A multi-agent env's batch: only rows that act or end reach a policy, only the
        learning policy's reach the trajectories; waiting rows add their reward to their
        slot's next step (``TrajectoryBuilder.credit_waits``), and get action 0."""
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
        rows = np.flatnonzero(learner_B)
        slots = slot_B[rows]
        first_L = self.builder.first_flags(slots)
        reward_L = np.where(first_L, np.float32(0.0), reward_B[rows])  # nothing before a start
        if self.refresh_weights is not None:
            self.refresh_weights()
        obs_BO = fb.obs_BO
        if self.normalizer is not None:
            self.normalizer.update(obs_BO[step_B])
            obs_BO = self.normalizer.normalize(obs_BO)
        mark("batch_assembly")
        action_BA = np.zeros((len(slot_B), *self.builder.action_shape), self.builder.action_dtype)
        unrolls = None
        if len(rows):
            action_LA, params_LP, state_before, state_after, step = self._policy(
                slots, obs_BO[rows], first_L
            )
            action_BA[rows] = action_LA
        if self.self_play is not None:
            assert opponent_B is not None
            opponents_B = acting_B & ~done_B & ~learner_B  # an ended agent's action is unused
            self.self_play.act(obs_BO, fb.obs_BO, slot_B, opponent_B, action_BA, opponents_B)
        mark("forward")
        episodes = None
        if len(rows):
            unrolls, episodes = self.builder.record(
                slots, obs_BO[rows], reward_L, fb.terminated_B[rows], fb.truncated_B[rows],
                first_L, action_LA, params_LP, state_before, state_after, step,
            )  # fmt: skip
            if episodes is not None and self.self_play is not None:
                self.self_play.finish(rows[done_B[rows]], episodes.returns)
        self.stats.on_batch(len(rows), episodes)
        mark("trajectory_write")
        self._reply(live, action_BA)
        mark("reply")
        await self._hand_over(unrolls, mark)

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

    def _policy(self, slot_B: np.ndarray, obs_BO: np.ndarray, first_B: np.ndarray):
        """One forward pass with T = 1: numpy actions, params, core states and the learner
        step of the weights that ran it (read under the lock: a trainer thread's step
        lands between two forward passes, never between a pass and its step number)."""
        state_before = tuple(s[slot_B] for s in self.builder.core_state_SH)
        with self.weights_lock:
            action_BA, params_BP, state_after = self.policy(obs_BO, first_B, state_before, slot_B)
            step = self.learner_step.value
        return action_BA, params_BP, state_before, state_after, step
