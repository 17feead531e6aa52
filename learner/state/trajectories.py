"""Trajectory builder: per-(actor, env) slots that turn the frame stream into unrolls.

Every slot keeps the running unroll of one environment as rows ``0..T`` of preallocated
numpy arrays (batch-major ``[slot, T+1, ...]``). Each inference batch writes one row for
many slots with a single fancy-index assignment; when a slot fills row ``T`` its unroll
(``T + 1`` frames) is copied out and row ``T`` becomes row ``0`` of the next one, so
consecutive unrolls overlap by one frame (the bootstrap frame).

Row ``t`` holds: the observation, the reward and terminated/truncated flags that came
*with* that observation (the outcome of the previous action), ``first`` (the frame
starts an episode), the action the policy took there, its policy parameters
(behaviour logits) and the learner step of the weights that chose it. The recurrent
core state before row 0 is kept for training.

With frame stacking (``frame_stack`` D > 1, observations ``[D, *F]`` that shift by one
frame per step and start each episode as zeros plus its first frame, see
:func:`seedrl.envs.frame_stack`) a slot stores single frames: the D - 1 frames of the
stack at row 0, then the newest frame of each row, so an unroll holds T + D frames
instead of (T + 1) x D. The stack the policy acts on is kept per slot as a ring of its
D newest frames (:meth:`TrajectoryBuilder.stack_frames`: one frame written per step, the
stack read in order), and :func:`stack_unroll_frames` rebuilds the stacks for training.

Shape suffixes: B frames in an inference batch, N finished unrolls, T unroll length,
O observation dims, A action dims, P policy-parameter dims, H core state size.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import DTypeLike

from seedrl import codec, envs
from seedrl.config import LearnerConfig
from seedrl.proto import seedrl_pb2 as pb

if TYPE_CHECKING:
    from learner.state.files import Lease


def stored_frame_stack(config: LearnerConfig, obs_spec: pb.SpaceSpec | None = None) -> int:
    """D when this learner takes and stores single frames of D-frame stacks, else 1.

    Not with --normalize-observations: unrolls keep the normalized observations the policy
    saw, and a stack rebuilt from frames normalized at different steps would differ. Not
    for a dict/tuple observation (``obs_spec``): its leaves travel whole, since the stacking
    rule is one tensor's and the spec does not say which leaves would stack.
    """
    if not config.frame_once or config.normalize_observations:
        return 1
    if obs_spec is not None and codec.is_structured(obs_spec):
        return 1
    return envs.frame_stack(config.env, config.env_kwargs)


@dataclass
class Unrolls:
    """N finished unrolls, batch-major ``[N, T+1, ...]``; the trainer makes them time-major."""

    obs: np.ndarray  # [N, T+1, *O]; with frame stacking the frames [N, T+D, *F]
    first: np.ndarray  # [N, T+1] bool
    reward: np.ndarray  # [N, T+1] float32
    terminated: np.ndarray  # [N, T+1] bool
    truncated: np.ndarray  # [N, T+1] bool
    action: np.ndarray  # [N, T+1, *A]
    policy_params: np.ndarray  # [N, T+1, P] float32
    core_state: tuple[np.ndarray, ...]  # each [N, H]: the core state before row 0
    acted_step: np.ndarray  # [N, T+1] int64: learner step of the weights that acted on each row
    sample_id: np.ndarray | None = None  # [N] int64: replay key of a sampled unroll (None: queued)
    sample_weight: np.ndarray | None = None  # [N] float32: its importance weight (None: all 1)
    running_return: np.ndarray | None = None
    """[N, T+1] float32: each row's discounted sum of its episode's rewards so far, kept
    when the agent asks (:attr:`TrajectoryBuilder.return_discount`), else None."""

    def __len__(self) -> int:
        return int(self.obs.shape[0])

    @property
    def frame_stack(self) -> int:
        """D when ``obs`` holds single frames of D-frame stacks (it then has D - 1 more rows
        than the flags), else 1."""
        return int(self.obs.shape[1] - self.first.shape[1] + 1)

    @staticmethod
    def concat(parts: list[Unrolls]) -> Unrolls:
        if len(parts) == 1:
            return parts[0]
        return Unrolls(
            obs=np.concatenate([p.obs for p in parts]),
            first=np.concatenate([p.first for p in parts]),
            reward=np.concatenate([p.reward for p in parts]),
            terminated=np.concatenate([p.terminated for p in parts]),
            truncated=np.concatenate([p.truncated for p in parts]),
            action=np.concatenate([p.action for p in parts]),
            policy_params=np.concatenate([p.policy_params for p in parts]),
            core_state=tuple(
                np.concatenate([p.core_state[i] for p in parts])
                for i in range(len(parts[0].core_state))
            ),
            acted_step=np.concatenate([p.acted_step for p in parts]),
            sample_id=_concat_optional([p.sample_id for p in parts]),
            sample_weight=_concat_optional([p.sample_weight for p in parts]),
            running_return=_concat_optional([p.running_return for p in parts]),
        )

    def select(self, index: np.ndarray) -> Unrolls:
        """The unrolls at ``index`` (copies), in its order."""
        picked: dict[str, object] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "core_state":
                picked[f.name] = tuple(s[index] for s in value)
            else:
                picked[f.name] = None if value is None else value[index]
        return Unrolls(**picked)  # type: ignore[arg-type]

    def split(self, n: int) -> tuple[Unrolls, Unrolls]:
        """The first ``n`` unrolls and the rest."""
        head: dict[str, object] = {}
        tail: dict[str, object] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "core_state":
                head[f.name] = tuple(s[:n] for s in value)
                tail[f.name] = tuple(s[n:] for s in value)
            elif value is None:
                head[f.name] = tail[f.name] = None
            else:
                head[f.name], tail[f.name] = value[:n], value[n:]
        return Unrolls(**head), Unrolls(**tail)  # type: ignore[arg-type]


def _concat_optional(arrays: list[np.ndarray | None]) -> np.ndarray | None:
    """The arrays joined, or None when any part lacks one."""
    if any(a is None for a in arrays):
        return None
    return np.concatenate(arrays)  # type: ignore[arg-type]


@dataclass
class FinishedEpisodes:
    """Episodes that ended in one batch: raw (unclipped) returns and lengths."""

    returns: np.ndarray  # [E] float64
    lengths: np.ndarray  # [E] int64


class TrajectoryBuilder:
    """Slots of running unrolls, allocated per connection and grown on demand."""

    def __init__(
        self,
        unroll_length: int,
        obs_shape: tuple[int, ...],
        obs_dtype: DTypeLike,
        action_shape: tuple[int, ...],
        action_dtype: DTypeLike,
        param_size: int,
        core_state_sizes: tuple[int, ...] = (),
        initial_capacity: int = 64,
        frame_stack: int = 1,
        overlap: int = 0,
        return_discount: float | None = None,
    ) -> None:
        """``overlap`` rows beyond the bootstrap frame are shared by a slot's consecutive
        unrolls: the next one starts at row ``T - overlap`` (R2D2's overlapping sequences).
        With ``return_discount`` each row also keeps its episode's discounted reward sum so
        far (:attr:`Unrolls.running_return`)."""
        if not 0 <= overlap < unroll_length:
            raise ValueError(f"overlap {overlap} must be in [0, {unroll_length})")
        if frame_stack > 1 and (len(obs_shape) < 2 or obs_shape[0] != frame_stack):
            raise ValueError(f"frame_stack {frame_stack} does not fit observations {obs_shape}")
        self.unroll_length = unroll_length
        self.overlap = overlap
        self.return_discount = return_discount
        self._rows = unroll_length + 1
        self.obs_shape = obs_shape
        self.obs_dtype = np.dtype(obs_dtype)
        self.frame_stack = frame_stack
        self.frame_shape = obs_shape[1:] if frame_stack > 1 else obs_shape
        """What one frame of a stream carries: a single frame with stacking, else the whole
        observation."""
        self._obs_rows = self._rows + frame_stack - 1
        self._ring_order_D = np.arange(1, frame_stack + 1)
        """Ring offsets after the newest frame's place, oldest first."""
        self._action_shape = action_shape
        self._action_dtype = np.dtype(action_dtype)
        self._param_size = param_size
        self._state_sizes = core_state_sizes
        self.capacity = 0
        self.last_origin: tuple[np.ndarray, np.ndarray] = (np.zeros(0, np.int64),) * 2
        """The slots the last unrolls :meth:`record` returned came from, and each one's
        number among its slot's unrolls (0: the first since the slot was allocated, whose
        row 0 is a new frame): what a dataset recorder stitches episodes by."""
        self._free: list[int] = []
        self._grow(initial_capacity)

    def layout(self) -> dict[str, Any]:
        """The arguments that build an empty builder of these shapes (another process's)."""
        return {
            "unroll_length": self.unroll_length,
            "obs_shape": self.obs_shape,
            "obs_dtype": self.obs_dtype.str,
            "action_shape": self._action_shape,
            "action_dtype": self._action_dtype.str,
            "param_size": self._param_size,
            "core_state_sizes": self._state_sizes,
            "frame_stack": self.frame_stack,
            "overlap": self.overlap,
            "return_discount": self.return_discount,
        }

    # ------------------------------------------------------------- slot management

    def _grow(self, capacity: int) -> None:
        old = self.capacity
        rows = self._rows

        def resized(arr: np.ndarray | None, shape: tuple[int, ...], dtype: DTypeLike) -> np.ndarray:
            new = np.zeros((capacity, *shape), dtype=dtype)
            if arr is not None:
                new[:old] = arr
            return new

        get = self.__dict__.get
        self.obs_SRO = resized(get("obs_SRO"), (self._obs_rows, *self.frame_shape), self.obs_dtype)
        if self.frame_stack > 1:
            self.ring_SDF = resized(get("ring_SDF"), self.obs_shape, self.obs_dtype)
            self.ring_newest_S = resized(get("ring_newest_S"), (), np.int64)
        self.first_SR = resized(get("first_SR"), (rows,), bool)
        self.reward_SR = resized(get("reward_SR"), (rows,), np.float32)
        self.terminated_SR = resized(get("terminated_SR"), (rows,), bool)
        self.truncated_SR = resized(get("truncated_SR"), (rows,), bool)
        self.action_SRA = resized(
            get("action_SRA"), (rows, *self._action_shape), self._action_dtype
        )
        self.params_SRP = resized(get("params_SRP"), (rows, self._param_size), np.float32)
        self.position_S = resized(get("position_S"), (), np.int64)
        self.next_first_S = resized(get("next_first_S"), (), bool)
        self.episode_return_S = resized(get("episode_return_S"), (), np.float64)
        self.episode_length_S = resized(get("episode_length_S"), (), np.int64)
        self.pending_reward_S = resized(get("pending_reward_S"), (), np.float64)
        self.step_SR = resized(get("step_SR"), (rows,), np.int64)
        self.unroll_count_S = resized(get("unroll_count_S"), (), np.int64)
        if self.return_discount is not None:
            self.running_return_S = resized(get("running_return_S"), (), np.float64)
            self.running_return_SR = resized(get("running_return_SR"), (rows,), np.float32)
        old_states = get("core_state_SH", [None] * len(self._state_sizes))
        self.core_state_SH = [
            resized(s, (h,), np.float32) for s, h in zip(old_states, self._state_sizes, strict=True)
        ]
        self.start_state_SH = [
            resized(s, (h,), np.float32)
            for s, h in zip(get("start_state_SH", old_states), self._state_sizes, strict=True)
        ]
        # With overlap the next unroll starts at a past row: the state before every row is
        # kept so that row's can become the start state.
        old_rows = get("row_state_SRH", [None] * len(self._state_sizes))
        self.row_state_SRH = [
            resized(s, (rows if self.overlap else 0, h), np.float32)
            for s, h in zip(old_rows, self._state_sizes, strict=True)
        ]
        self._free.extend(range(capacity - 1, old - 1, -1))
        self.capacity = capacity

    def empty_unrolls(self, n: int) -> Unrolls:
        """Zeroed unrolls of this builder's shapes and dtypes (e.g. to size shared buffers)."""
        rows = self._rows
        return Unrolls(
            obs=np.zeros((n, self._obs_rows, *self.frame_shape), self.obs_dtype),
            first=np.zeros((n, rows), bool),
            reward=np.zeros((n, rows), np.float32),
            terminated=np.zeros((n, rows), bool),
            truncated=np.zeros((n, rows), bool),
            action=np.zeros((n, rows, *self._action_shape), self._action_dtype),
            policy_params=np.zeros((n, rows, self._param_size), np.float32),
            core_state=tuple(np.zeros((n, h), np.float32) for h in self._state_sizes),
            acted_step=np.zeros((n, rows), np.int64),
            sample_id=np.full(n, -1, np.int64),
            sample_weight=np.ones(n, np.float32),
            running_return=(
                None if self.return_discount is None else np.zeros((n, rows), np.float32)
            ),
        )

    def allocate(self, count: int) -> np.ndarray:
        """Reserve ``count`` fresh slots (reset: empty unroll, new episode, zero core state)."""
        while len(self._free) < count:
            self._grow(max(2 * self.capacity, self.capacity + count))
        ids = np.array([self._free.pop() for _ in range(count)], dtype=np.int64)
        self._reset(ids)
        return ids

    def restart(self, ids: np.ndarray) -> int:
        """Start slots in use afresh, as if just allocated (their envs start a new episode
        with the next frame, so call it after one ended): the partial unrolls are dropped.
        Returns frames lost."""
        lost = int(self.position_S[ids].sum())
        self._reset(ids)
        return lost

    def _reset(self, ids: np.ndarray) -> None:
        self.position_S[ids] = 0
        self.next_first_S[ids] = True
        self.episode_return_S[ids] = 0.0
        self.episode_length_S[ids] = -1  # the reset frame is step 0, as after a done frame
        self.pending_reward_S[ids] = 0.0
        self.unroll_count_S[ids] = 0
        if self.return_discount is not None:
            self.running_return_S[ids] = 0.0
        for state in self.core_state_SH:
            state[ids] = 0.0

    def release(self, ids: np.ndarray) -> int:
        """Return slots to the pool; their partial unrolls are dropped. Returns frames lost."""
        lost = int(self.position_S[ids].sum())
        self._free.extend(int(i) for i in ids)
        return lost

    @property
    def slots_in_use(self) -> int:
        return self.capacity - len(self._free)

    @property
    def action_shape(self) -> tuple[int, ...]:
        return self._action_shape

    @property
    def action_dtype(self) -> np.dtype:
        return self._action_dtype

    def credit_waits(
        self, slot_B: np.ndarray, reward_B: np.ndarray, step_B: np.ndarray
    ) -> np.ndarray:
        """Multi-agent rows: the rewards of rows that wait (``~step_B``) add up per slot and
        go to the slot's next row that steps (acts or ends), so an agent's action is
        credited with everything it received until its next turn. Returns the rewards with
        those sums added on the stepping rows (waiting rows' own rewards left as sent)."""
        pending_S = self.pending_reward_S
        waiting_B = ~step_B
        np.add.at(pending_S, slot_B[waiting_B], reward_B[waiting_B])
        stepping = slot_B[step_B]
        credited_B = reward_B.astype(np.float32, copy=True)
        credited_B[step_B] += pending_S[stepping].astype(np.float32)
        pending_S[stepping] = 0.0
        return credited_B

    # ------------------------------------------------------------- the per-batch path

    def first_flags(self, slot_B: np.ndarray) -> np.ndarray:
        """``first`` for the frames about to be recorded (read before inference, for the LSTM)."""
        return self.next_first_S[slot_B].copy()

    def stack_frames(
        self, slot_B: np.ndarray, frame_BF: np.ndarray, first_B: np.ndarray
    ) -> np.ndarray:
        """Push each slot's newest frame onto its stack; returns the stacks ``[B, D, *F]``.

        Call it once per frame, before :meth:`record` of the same frames (the unroll that
        completes there starts the next one from this stack). Each slot's ring takes the
        new frame in place of its oldest (all zeros first at an episode start), so a step
        writes one frame and reads the D in order, where shifting a stored stack wrote
        and moved all of them.
        """
        newest_B = (self.ring_newest_S[slot_B] + 1) % self.frame_stack
        self.ring_newest_S[slot_B] = newest_B
        if first_B.any():
            self.ring_SDF[slot_B[first_B]] = 0
        self.ring_SDF[slot_B, newest_B] = frame_BF
        return self._stacks(slot_B, newest_B)

    def _stacks(self, slot_B: np.ndarray, newest_B: np.ndarray) -> np.ndarray:
        """The slots' stacks in order, oldest frame first: ``[B, D, *F]``."""
        order_BD = (newest_B[:, None] + self._ring_order_D) % self.frame_stack
        return self.ring_SDF[slot_B[:, None], order_BD]

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
        """Write one frame per slot; return the unrolls that completed and episodes that ended.

        ``learner_step``: the step of the weights that acted, for all rows or per row
        (rows answered by different batches, as a serving-tier frontend records them)."""
        pos_B = self.position_S[slot_B]
        self.obs_SRO[slot_B, pos_B + (self.frame_stack - 1)] = obs_BO
        self.first_SR[slot_B, pos_B] = first_B
        self.reward_SR[slot_B, pos_B] = reward_B
        self.terminated_SR[slot_B, pos_B] = terminated_B
        self.truncated_SR[slot_B, pos_B] = truncated_B
        self.action_SRA[slot_B, pos_B] = action_BA
        self.params_SRP[slot_B, pos_B] = params_BP
        self.step_SR[slot_B, pos_B] = learner_step
        if self.return_discount is not None:
            # A sum starts afresh at an episode's first frame.
            running_B = self.running_return_S[slot_B]
            carried_B = np.where(first_B, 0.0, self.return_discount * running_B)
            self.running_return_S[slot_B] = carried_B + reward_B
            self.running_return_SR[slot_B, pos_B] = self.running_return_S[slot_B]
        for store, after in zip(self.core_state_SH, state_after_BH, strict=True):
            store[slot_B] = after
        if self.overlap:
            for rows_store, before in zip(self.row_state_SRH, state_before_BH, strict=True):
                rows_store[slot_B, pos_B] = before

        starting = pos_B == 0
        if starting.any():
            self._mark_start(slot_B[starting], [s[starting] for s in state_before_BH])

        done_B = terminated_B | truncated_B
        self.next_first_S[slot_B] = done_B
        episodes = self._episode_stats(slot_B, reward_B, done_B)

        full = pos_B == self.unroll_length
        unrolls = None
        if full.any():
            full_slots = slot_B[full]
            unrolls = self._take_unrolls(full_slots)
            self._roll_over(full_slots, [s[full] for s in state_before_BH])
        self.position_S[slot_B] = np.where(full, 1 + self.overlap, pos_B + 1)
        return unrolls, episodes

    def _mark_start(self, slots: np.ndarray, state_before: list[np.ndarray]) -> None:
        for store, before in zip(self.start_state_SH, state_before, strict=True):
            store[slots] = before

    def _episode_stats(
        self, slot_B: np.ndarray, reward_B: np.ndarray, done_B: np.ndarray
    ) -> FinishedEpisodes | None:
        self.episode_return_S[slot_B] += reward_B
        self.episode_length_S[slot_B] += 1
        if not done_B.any():
            return None
        ended = slot_B[done_B]
        finished = FinishedEpisodes(
            returns=self.episode_return_S[ended].copy(),
            lengths=self.episode_length_S[ended].copy(),
        )
        # The reset frame that follows carries reward 0 and counts as step 0 of the next one.
        self.episode_return_S[ended] = 0.0
        self.episode_length_S[ended] = -1
        return finished

    def _take_unrolls(self, slots: np.ndarray) -> Unrolls:
        self.last_origin = (slots.copy(), self.unroll_count_S[slots].copy())
        self.unroll_count_S[slots] += 1
        return Unrolls(
            obs=self.obs_SRO[slots],
            first=self.first_SR[slots],
            reward=self.reward_SR[slots],
            terminated=self.terminated_SR[slots],
            truncated=self.truncated_SR[slots],
            action=self.action_SRA[slots],
            policy_params=self.params_SRP[slots],
            core_state=tuple(s[slots] for s in self.start_state_SH),
            acted_step=self.step_SR[slots],
            running_return=None if self.return_discount is None else self.running_return_SR[slots],
        )

    def _row_arrays(self) -> list[np.ndarray]:
        """The per-row arrays a roll-over carries into the next unroll (frames apart)."""
        arrays = [
            self.first_SR,
            self.reward_SR,
            self.terminated_SR,
            self.truncated_SR,
            self.action_SRA,
            self.params_SRP,
            self.step_SR,
        ]
        if self.return_discount is not None:
            arrays.append(self.running_return_SR)
        return arrays

    def _roll_over(self, slots: np.ndarray, state_before: list[np.ndarray]) -> None:
        """Row T becomes row 0 of the next unroll (the one-frame overlap); with
        ``overlap`` k, rows T-k..T become rows 0..k."""
        if self.overlap:
            self._roll_over_rows(slots)
            return
        last = self.unroll_length
        if self.frame_stack > 1:
            # Row 0's whole stack, its zeros included: the rows before it are not kept.
            stacks = self._stacks(slots, self.ring_newest_S[slots])
            self.obs_SRO[slots, : self.frame_stack] = stacks
        else:
            self.obs_SRO[slots, 0] = self.obs_SRO[slots, last]
        for arr in self._row_arrays():
            arr[slots, 0] = arr[slots, last]
        self._mark_start(slots, state_before)

    def _roll_over_rows(self, slots: np.ndarray) -> None:
        """Rows T-k..T (and their frames) become rows 0..k of the next unroll, with the
        core state before row T-k as its start state."""
        k, last, depth = self.overlap, self.unroll_length, self.frame_stack
        start = last - k
        if depth > 1:
            # Row `start`'s stack without planes from before its episode (not kept after).
            keep_ND = stacked_plane_mask(self.first_SR[slots], depth)[:, start]
            head = self.obs_SRO[slots, start : start + depth]
            keep = keep_ND.reshape(*keep_ND.shape, *(1,) * (head.ndim - 2))
            self.obs_SRO[slots, :depth] = np.where(keep, head, 0)
            newer = self.obs_SRO[slots, start + depth : last + depth]
            self.obs_SRO[slots, depth : k + depth] = newer
        else:
            self.obs_SRO[slots, : k + 1] = self.obs_SRO[slots, start : last + 1]
        for arr in self._row_arrays():
            arr[slots, : k + 1] = arr[slots, start : last + 1]
        self._mark_start(slots, [rows[slots, start] for rows in self.row_state_SRH])
        for rows in self.row_state_SRH:
            rows[slots, : k + 1] = rows[slots, start : last + 1]


def stack_unroll_frames(frames_NXF: np.ndarray, first_NR: np.ndarray) -> np.ndarray:
    """The stacked observations ``[N, T+1, D, *F]`` of unrolls stored as frames.

    ``frames_NXF`` is :attr:`Unrolls.obs` of stacked unrolls (``X = T + D``): plane ``j``
    of row ``t`` is frame ``t + j``, but zero when it comes from before the last episode
    start at or before row ``t`` (the zeros a fresh stack starts with).
    """
    rows = first_NR.shape[1]
    depth = frames_NXF.shape[1] - rows + 1
    windows = np.lib.stride_tricks.sliding_window_view(frames_NXF, depth, axis=1)
    windows = np.moveaxis(windows, -1, 2)  # [N, T+1, D, *F]
    keep = stacked_plane_mask(first_NR, depth)
    return np.where(keep.reshape(*keep.shape, *(1,) * (frames_NXF.ndim - 2)), windows, 0)


def stacked_plane_mask(first_NR: np.ndarray, depth: int) -> np.ndarray:
    """``[N, T+1, D]``: plane ``j`` of row ``t`` holds a frame of the row's own episode."""
    rows = first_NR.shape[1]
    t_R = np.arange(rows)
    last_start_NR = np.maximum.accumulate(np.where(first_NR, t_R, -depth), axis=1)
    plane_row_RD = t_R[:, None] - (depth - 1) + np.arange(depth)
    return plane_row_RD[None] >= last_start_NR[..., None]


class UnrollQueue:
    """Bounded hand-off of finished unrolls from inference (event loop) to the trainer thread.

    Bounded in unrolls: when the trainer falls behind, ``put`` blocks, which stalls the
    batcher and so slows inference instead of growing memory (back-pressure).
    """

    def __init__(self, max_unrolls: int) -> None:
        self.max_unrolls = max_unrolls
        self._parts: list[Unrolls] = []
        self._count = 0
        self._closed = False
        self._cond = threading.Condition()

    def __len__(self) -> int:
        return self._count

    def has_room(self) -> bool:
        return self._count < self.max_unrolls or self._closed

    def put(self, unrolls: Unrolls, timeout: float | None = None) -> bool:
        """Append; waits while full. False if it timed out or the queue is closed."""
        with self._cond:
            if not self._cond.wait_for(self.has_room, timeout):
                return False
            if self._closed:
                return False
            self._parts.append(unrolls)
            self._count += len(unrolls)
            self._cond.notify_all()
            return True

    def get(self, n: int, timeout: float | None = None) -> Unrolls | None:
        """Exactly ``n`` unrolls, or None on timeout or close."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._count >= n or self._closed, timeout):
                return None
            if self._count < n:
                return None
            merged = Unrolls.concat(self._parts)
            batch, rest = merged.split(n)
            self._parts = [rest] if len(rest) else []
            self._count -= n
            self._cond.notify_all()
            return batch

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def feedback(self, sample_id: np.ndarray, priority: np.ndarray) -> None:
        """Nothing: a queue hands each unroll out once, so it keeps no priorities."""

    def metrics(self) -> dict[str, float]:
        """Nothing beyond its length, which the stats already report."""
        return {}

    def save(self, path: Path, lease: Lease | None = None) -> int:
        """Nothing: queued unrolls were acted by the weights of the moment and are trained
        on once, so a resumed run acts anew rather than carry them over."""
        return 0

    def load(self, path: Path, template: Unrolls) -> int:
        """Nothing to take back (:meth:`save` writes nothing)."""
        return 0
