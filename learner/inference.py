"""The learner's hot loop: one closed batch -> one forward pass -> actions back.

``InferenceEngine.process`` runs on the event loop for every batch the
:class:`~learner.batcher.DynamicBatcher` closes: gather the K frames of each pending
stream into one array, read each slot's recurrent state, run the policy once, sample
actions, record the frames into the trajectory builder, answer every stream, and hand
finished unrolls to the trainer (waiting when its queue is full: back-pressure).

Shape suffixes: B frames in the batch, O observation dims, A action dims, P policy
parameters, H core state size.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

import numpy as np
import torch

from learner.batcher import PendingRequest
from learner.stats import LearnerStats
from learner.trajectories import TrajectoryBuilder, UnrollQueue
from seedrl.models import ActionHead, ActorCritic


@dataclass(eq=False)
class Connection:
    """One admitted actor stream and the trajectory slots of its K envs."""

    actor_id: str
    run_id: str
    peer: str
    num_envs: int
    slot_ids: np.ndarray
    frames: int = 0
    closed: bool = False


class FramePayload:
    """The decoded arrays of one stream's frame (views into the received message)."""

    __slots__ = ("conn", "obs_KO", "reward_K", "terminated_K", "truncated_K")

    def __init__(self, conn, obs_KO, reward_K, terminated_K, truncated_K) -> None:
        self.conn: Connection = conn
        self.obs_KO: np.ndarray = obs_KO
        self.reward_K: np.ndarray = reward_K
        self.terminated_K: np.ndarray = terminated_K
        self.truncated_K: np.ndarray = truncated_K


class InferenceEngine:
    """Runs the shared model for batches of frames; the same weights the trainer updates."""

    def __init__(
        self,
        model: ActorCritic,
        head: ActionHead,
        device: torch.device,
        builder: TrajectoryBuilder,
        queue: UnrollQueue,
        stats: LearnerStats,
        weights_lock: threading.Lock,
        learner_step: StepCounter,
    ) -> None:
        self.model = model
        self.head = head
        self.device = device
        self.builder = builder
        self.queue = queue
        self.stats = stats
        self.weights_lock = weights_lock
        self.learner_step = learner_step
        self._released: list[np.ndarray] = []
        self.keep_unrolls = True
        """False with --no-train: nobody consumes unrolls, so they are not queued."""

    def release_later(self, conn: Connection) -> None:
        """Free a closed stream's slots between batches, never under a batch in flight."""
        conn.closed = True
        self._released.append(conn.slot_ids)

    def _release_closed(self) -> None:
        while self._released:
            lost = self.builder.release(self._released.pop())
            self.stats.frames_dropped += lost

    async def process(self, batch: list[PendingRequest]) -> None:
        self._release_closed()
        live = [r for r in batch if not r.payload.conn.closed]
        if not live:
            return
        frames: list[FramePayload] = [r.payload for r in live]
        slot_B = np.concatenate([f.conn.slot_ids for f in frames])
        obs_BO = np.concatenate([f.obs_KO for f in frames])
        reward_B = np.concatenate([f.reward_K for f in frames])
        terminated_B = np.concatenate([f.terminated_K for f in frames])
        truncated_B = np.concatenate([f.truncated_K for f in frames])
        first_B = self.builder.first_flags(slot_B)

        action_BA, params_BP, state_before, state_after = self._policy(slot_B, obs_BO, first_B)

        step = self.learner_step.value
        unrolls, episodes = self.builder.record(
            slot_B, obs_BO, reward_B, terminated_B, truncated_B, first_B,
            action_BA, params_BP, state_before, state_after, step,
        )  # fmt: skip
        self.stats.on_batch(len(slot_B), episodes)

        offset = 0
        for request, frame in zip(live, frames, strict=True):
            k = frame.conn.num_envs
            frame.conn.frames += k
            if not request.future.done():
                request.future.set_result(action_BA[offset : offset + k])
            offset += k

        if unrolls is not None and self.keep_unrolls:
            await self._enqueue(unrolls)

    def _policy(self, slot_B: np.ndarray, obs_BO: np.ndarray, first_B: np.ndarray):
        """One forward pass with T = 1; returns numpy actions, params and core states."""
        state_before = tuple(s[slot_B] for s in self.builder.core_state_SH)
        obs = torch.from_numpy(obs_BO).to(self.device, non_blocking=True)
        first = torch.from_numpy(first_B).to(self.device)
        core = tuple(torch.from_numpy(s).to(self.device) for s in state_before)
        with torch.no_grad(), self.weights_lock:
            params_1BP, _, core_after = self.model(obs.unsqueeze(0), first.unsqueeze(0), core)
        params_BP = params_1BP[0]
        action_BA = self.head.sample(params_BP)
        state_after = tuple(s.cpu().numpy() for s in core_after)
        return action_BA.cpu().numpy(), params_BP.cpu().numpy(), state_before, state_after

    async def _enqueue(self, unrolls) -> None:
        if self.queue.has_room():
            self.queue.put(unrolls)
            return
        with self.stats.timer("inference_wait_trainer"):
            await asyncio.to_thread(self.queue.put, unrolls)


class StepCounter:
    """Learner steps, written by the trainer thread and read by inference (an int is atomic)."""

    def __init__(self, value: int = 0) -> None:
        self.value = value
