"""The serving core: one batch of rows -> one forward pass -> every row's action.

A row is one env's frame (or one agent's, for a multi-agent env) with the trajectory slot
it belongs to; a batch is numpy arrays of B rows (:class:`FrameBatch`). :meth:`ServingCore.serve`
is everything the learner does for a batch besides the transport: decide who plays each
row, read each slot's recurrent state and frame stack, normalise, run the policy once,
fill in every row's action and record the learning policy's rows into the trajectory
builder. Whoever gathered the rows answers them and hands the finished unrolls on: the
inference engine (rows from actors' gRPC streams), the synchronous driver (rows of a
vector env stepped in process), and the serving tier's model process (rows of its slot
table). Nothing here knows a stream, a message or an event loop.

A single-agent batch is the case where the learning policy plays every row. In a
multi-agent batch only rows that act or end reach a policy: a waiting row gets action 0
and its reward is credited to its slot's next step; with self-play the rows of an
opponent's agent are acted on by a frozen snapshot and never reach the trajectories.

Shape suffixes: B rows in the batch, L rows the learning policy steps on, O observation
dims, A action dims, P policy parameters, H core state size.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from learner.agents.policy import CoreStateArrays, Policy
from learner.state.counters import StepCounter
from learner.state.normalize import Normalizer
from learner.state.stats import LearnerStats
from learner.state.trajectories import FinishedEpisodes, TrajectoryBuilder, Unrolls

if TYPE_CHECKING:  # the league's modules load only for --self-play
    from learner.serving.selfplay import SelfPlay


@dataclass
class FrameBatch:
    """The rows of one forward pass as arrays, B rows in the order they were gathered."""

    slot_B: np.ndarray
    obs_BO: np.ndarray
    reward_B: np.ndarray
    terminated_B: np.ndarray
    truncated_B: np.ndarray
    acting_B: np.ndarray | None = None
    """A multi-agent env's rows that act; None for a single-agent env (all act)."""


@dataclass(frozen=True)
class Turns:
    """Who plays the rows of one batch; the defaults are a single-agent batch's, where the
    learning policy plays every row."""

    learner_L: np.ndarray | None = None
    """Index of the rows the learning policy steps on (acts on and records); None: all."""
    learner_B: np.ndarray | None = None
    """The same rows as a mask."""
    step_B: np.ndarray | None = None
    """Rows that act or end, whoever plays them."""
    done_B: np.ndarray | None = None
    reward_B: np.ndarray | None = None
    """The rewards with each slot's waiting rows' rewards credited to its stepping row."""
    opponent_B: np.ndarray | None = None
    """With self-play, the snapshot that plays each row's env against the learning policy."""

    def of_learner(self, array_B: np.ndarray) -> np.ndarray:
        """The learning policy's rows of a batch array."""
        return array_B if self.learner_L is None else array_B[self.learner_L]

    def among(self, positions: np.ndarray) -> Turns:
        """These turns with only the learning rows at ``positions`` (of ``learner_L``):
        one policy's share of a multi-agent batch."""
        assert self.learner_L is not None and self.learner_B is not None
        learner_L = self.learner_L[positions]
        learner_B = np.zeros_like(self.learner_B)
        learner_B[learner_L] = True
        return Turns(learner_L, learner_B, self.step_B, self.done_B, self.reward_B, self.opponent_B)


EVERY_ROW = Turns()
"""A single-agent batch's turns (never changed: one for every batch)."""


def every_row_of_several(rows: FrameBatch) -> Turns:
    """A single-agent batch's turns spelled out row by row, so that :meth:`Turns.among`
    can share its rows out among several policies (a population's members); a reset
    frame's reward is 0 either way."""
    every_B = np.ones(len(rows.slot_B), np.bool_)
    return Turns(np.arange(len(every_B)), every_B, None, None, rows.reward_B, None)


class Forward(NamedTuple):
    """One forward pass over the learning policy's rows, and the learner step of its weights."""

    action_LA: np.ndarray
    params_LP: np.ndarray
    state_before: CoreStateArrays
    state_after: CoreStateArrays
    step: int


@dataclass
class ServedPolicy:
    """One of several trained policies (--policy-mapping) as the core serves it: its
    action choice, the lock and step of its weights, and its own stats."""

    policy: Policy
    weights_lock: AbstractContextManager[Any]
    learner_step: StepCounter
    stats: LearnerStats | None = None
    """Its own agents' frames and episodes (None: only the learner's stats count them)."""
    refresh_weights: Callable[[], None] | None = None


class Handoff(NamedTuple):
    """The unrolls one policy's rows of a batch completed, for that policy's store alone."""

    policy: int
    """Its index among the core's policies."""
    unrolls: Unrolls | None
    origin: tuple[np.ndarray, np.ndarray]
    """Their slots and per-slot unroll counts (the builder's ``last_origin`` as they were
    taken: the next policy's record moves it on)."""


def policy_groups(
    learner_L: np.ndarray | None, policy_B: np.ndarray | None
) -> list[tuple[int, np.ndarray | None]]:
    """The learning rows grouped by the policy that plays them: (policy index, positions
    among ``learner_L``) per policy with rows there; one group of every position (None)
    when one policy plays every row (``policy_B`` None)."""
    if policy_B is None or learner_L is None:
        return [(0, None)]
    policy_L = policy_B[learner_L]
    return [(p, np.flatnonzero(policy_L == p)) for p in np.unique(policy_L).tolist()]


def joined_episodes(ended: list[FinishedEpisodes]) -> FinishedEpisodes | None:
    """The episodes several policies' rows ended in one batch, as one record."""
    if len(ended) <= 1:
        return ended[0] if ended else None
    return FinishedEpisodes(
        returns=np.concatenate([e.returns for e in ended]),
        lengths=np.concatenate([e.lengths for e in ended]),
    )


class ServingCore:
    """Runs the learning policy for batches of rows, on the weights training updates."""

    def __init__(
        self,
        policy: Policy,
        builder: TrajectoryBuilder,
        stats: LearnerStats,
        weights_lock: AbstractContextManager[Any],
        learner_step: StepCounter,
        refresh_weights: Callable[[], None] | None = None,
        normalizer: Normalizer | None = None,
        self_play: SelfPlay | None = None,
        policies: list[ServedPolicy] | None = None,
    ) -> None:
        """``policy`` is the agent's action choice over the weights inference runs
        (``Agent.inference_policy``); ``weights_lock`` is held around each forward pass.
        ``policies``: a multi-agent env's several trained policies, each on its own
        weights, in place of ``policy`` (:meth:`serve_policies`)."""
        self.policy = policy
        self.builder = builder
        self.stats = stats
        self.weights_lock = weights_lock
        self.learner_step = learner_step
        self.refresh_weights = refresh_weights
        """Called before each forward pass when training runs on other weights (the trainer
        process, the device trainer)."""
        self.normalizer = normalizer
        """With --normalize-observations: updated with, then applied to, every batch; the
        builder then stores the normalized float32 frames the policy acted on."""
        self.self_play = self_play
        """Two-player games with --self-play: seats, opponents and results."""
        self._phase_marks = stats.phase_marks()
        self.served = policies or [
            ServedPolicy(policy, weights_lock, learner_step, None, refresh_weights)
        ]
        """Every policy rows are grouped by (one: ``policy``)."""

    def serve(
        self, rows: FrameBatch, fresh_slots: np.ndarray | None = None
    ) -> tuple[np.ndarray, Unrolls | None]:
        """Every row's action, and the unrolls this batch's rows completed.

        ``fresh_slots``: slots whose envs start afresh with this batch (a new stream's),
        which self-play must not take for a game under way. Phases are timed from the
        caller's ``begin`` (``--time-phases``), so its gather counts as batch assembly.
        """
        action_BA, handoffs = self.serve_policies(rows, fresh_slots)
        return action_BA, handoffs[0].unrolls if handoffs else None

    def serve_policies(
        self,
        rows: FrameBatch,
        fresh_slots: np.ndarray | None = None,
        policy_B: np.ndarray | None = None,
    ) -> tuple[np.ndarray, list[Handoff]]:
        """:meth:`serve` with the learning rows grouped by policy (``policy_B``: each
        row's index among the core's policies; None: the one policy plays them all): one
        forward pass per policy with rows, and each policy's completed unrolls apart."""
        _, mark = self._phase_marks
        turns = self._turns(rows, fresh_slots)
        if turns.learner_L is None and policy_B is not None:  # a population's members
            turns = every_row_of_several(rows)
        slot_L = turns.of_learner(rows.slot_B)
        first_L = self.builder.first_flags(slot_L)
        refreshes = [s.refresh_weights for s in self.served if s.refresh_weights is not None]
        if refreshes:
            mark("batch_assembly")
            for refresh in refreshes:
                refresh()
            mark("trainer_handoff")
        seen_BO = self._observations(rows, turns, slot_L, first_L)
        mark("batch_assembly")
        played = []
        for index, among_L in policy_groups(turns.learner_L, policy_B):
            own = turns if among_L is None else turns.among(among_L)
            slot_G = own.of_learner(rows.slot_B)
            first_G = first_L if among_L is None else first_L[among_L]
            # A multi-agent batch may hold no row the learning policy steps on.
            forward = None
            if len(slot_G):
                seen_GO = own.of_learner(seen_BO)
                forward = self._forward(slot_G, seen_GO, first_G, self.served[index])
            played.append((index, own, slot_G, first_G, forward))
        action_BA = self._actions(rows, turns, seen_BO, [(p[1], p[4]) for p in played])
        mark("forward")
        handoffs, ended = [], []
        for index, own, slot_G, first_G, forward in played:
            unrolls, episodes = self._record(rows, own, slot_G, first_G, seen_BO, forward)
            if forward is not None:
                handoffs.append(Handoff(index, unrolls, self.builder.last_origin))
            if episodes is not None:
                ended.append(episodes)
            stats = self.served[index].stats
            if stats is not None:
                stats.on_batch(len(slot_G), episodes)
        self.stats.on_batch(len(slot_L), joined_episodes(ended))
        mark("trajectory_write")
        return action_BA, handoffs

    def _turns(self, rows: FrameBatch, fresh_slots: np.ndarray | None) -> Turns:
        """A multi-agent batch's rows that step (act or end) and which of them the learning
        policy plays: all of them, or with self-play its seat's."""
        if rows.acting_B is None:
            return EVERY_ROW
        slot_B, acting_B = rows.slot_B, rows.acting_B
        done_B = rows.terminated_B | rows.truncated_B
        step_B = acting_B | done_B
        reward_B = self.builder.credit_waits(slot_B, rows.reward_B, step_B)
        learner_B, opponent_B = step_B, None
        if self.self_play is not None:
            self.self_play.snapshot_due(self.learner_step.value)  # the first one at once
            if fresh_slots is not None:
                self.self_play.reset(fresh_slots)
            seat_B, opponent_B = self.self_play.seats(slot_B, acting_B, done_B)
            learner_B = step_B & seat_B
        return Turns(np.flatnonzero(learner_B), learner_B, step_B, done_B, reward_B, opponent_B)

    def _observations(
        self, rows: FrameBatch, turns: Turns, slot_L: np.ndarray, first_L: np.ndarray
    ) -> np.ndarray:
        """Every row as the policies see it: with frame stacking its slot's stack with the
        new frame pushed on (single-agent rows only: no multi-agent env stacks frames), with
        --normalize-observations normalized by statistics updated with the stepping rows."""
        obs_BO = rows.obs_BO
        if self.builder.frame_stack > 1:
            obs_BO = self.builder.stack_frames(slot_L, obs_BO, first_L)
        if self.normalizer is not None:
            self.normalizer.update(obs_BO if turns.step_B is None else obs_BO[turns.step_B])
            obs_BO = self.normalizer.normalize(obs_BO)
        return obs_BO

    def _forward(
        self,
        slot_L: np.ndarray,
        obs_LO: np.ndarray,
        first_L: np.ndarray,
        served: ServedPolicy | None = None,
    ) -> Forward:
        """One forward pass with T = 1 on the learning policy's rows (``served``: one of
        several policies; default the one). The learner step is read under the lock: a
        trainer thread's step lands between two forward passes, never between a pass and
        its step number."""
        served = self.served[0] if served is None else served
        state_before = tuple(s[slot_L] for s in self.builder.core_state_SH)
        with served.weights_lock:
            action_LA, params_LP, state_after = served.policy(obs_LO, first_L, state_before, slot_L)
            step = served.learner_step.value
        return Forward(action_LA, params_LP, state_before, state_after, step)

    def _actions(
        self,
        rows: FrameBatch,
        turns: Turns,
        seen_BO: np.ndarray,
        forwards: list[tuple[Turns, Forward | None]],
    ) -> np.ndarray:
        """Every row's action: each learning policy's on its rows (``forwards``: each
        policy's turns and pass), a self-play opponent's on its agent's acting rows (one
        forward pass of all snapshots), 0 on the rest."""
        if turns.learner_L is None:
            ((_, forward),) = forwards
            assert forward is not None
            return forward.action_LA
        builder = self.builder
        action_BA = np.zeros((len(rows.slot_B), *builder.action_shape), builder.action_dtype)
        for own, forward in forwards:
            if forward is not None:
                action_BA[own.learner_L] = forward.action_LA
        if self.self_play is not None:
            acting_B, done_B, learner_B = rows.acting_B, turns.done_B, turns.learner_B
            assert acting_B is not None and done_B is not None and learner_B is not None
            assert turns.opponent_B is not None
            opponents_B = acting_B & ~done_B & ~learner_B  # an ended agent's action is unused
            self.self_play.act(
                seen_BO, rows.obs_BO, rows.slot_B, turns.opponent_B, action_BA, opponents_B
            )
        return action_BA

    def _record(
        self,
        rows: FrameBatch,
        turns: Turns,
        slot_L: np.ndarray,
        first_L: np.ndarray,
        seen_BO: np.ndarray,
        forward: Forward | None,
    ) -> tuple[Unrolls | None, FinishedEpisodes | None]:
        """The learning policy's rows into the trajectories: the frames it saw (the newest
        frames with frame stacking, whose stacks the builder keeps), the credited rewards
        (none before a multi-agent episode's start); a self-play game's result as it ends."""
        if forward is None:
            return None, None
        stored_LO = turns.of_learner(rows.obs_BO if self.builder.frame_stack > 1 else seen_BO)
        reward_L = rows.reward_B
        if turns.learner_L is not None:
            assert turns.reward_B is not None
            reward_L = np.where(first_L, np.float32(0.0), turns.reward_B[turns.learner_L])
        unrolls, episodes = self.builder.record(
            slot_L, stored_LO, reward_L, turns.of_learner(rows.terminated_B),
            turns.of_learner(rows.truncated_B), first_L, *forward,
        )  # fmt: skip
        if episodes is not None and self.self_play is not None:
            assert turns.learner_L is not None and turns.done_B is not None
            self.self_play.finish(turns.learner_L[turns.done_B[turns.learner_L]], episodes.returns)
        return unrolls, episodes
