"""Self-play in the serving loop: who plays each seat of a two-player game, and the
frozen opponents' actions from the same batched inference.

With ``--self-play`` every env of a two-agent game is one match at a time: when an env's
episode starts (its first acting row after all its agents ended), the learning policy
takes one agent, drawn at random (so it learns to move first and second), and the other
gets a snapshot from the league's pool (``learner.league.pool.SnapshotPool.sample``).
Rows of the learning policy's agent are acted on and trained as any slot; rows of the
opponent's agent are acted on by that snapshot's frozen weights, all snapshots' rows in
one vmapped forward pass (:class:`~learner.agents.ensemble.StackedModels`), and never
reach the trainer. When the learning policy's agent
ends its episode, the sign of its return is the result (win > 0, draw 0, loss < 0),
recorded in the league (the pool's counts steer pfsp sampling; the Elo ratings move).

A fixed opponent (``--fixed-opponents``: a scripted player such as Connect Four's
heuristic) is drawn like a snapshot; its rows are turned back into the observations the
env gave (the raw ones, before normalisation) and it chooses their actions itself.

Every ``--snapshot-every`` learner steps the weights inference runs are copied into the
pool (the first at once, so an opponent always exists). Pool and ratings are the learner's
:class:`~learner.league.league.League`, saved in checkpoints and restored by ``--resume``.

Shape suffixes: B rows of a batch, E envs of a batch, S slots.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import torch

from learner.agents.ensemble import StackedModels
from learner.agents.policy import Policy
from learner.league.league import League
from learner.league.pool import Outcome


def outcome_of(episode_return: float) -> Outcome:
    """A zero-sum game's result from the learning policy's return."""
    if episode_return > 0:
        return Outcome.WIN
    return Outcome.LOSS if episode_return < 0 else Outcome.DRAW


class SelfPlay:
    """Seats and opponents of every env slot, and the opponents' forward passes.

    Envs are keyed by the slot of their first agent's row (a stream's rows come env by
    env, ``agents`` rows each, and every slot is unique), so per-env state lives in arrays
    indexed like the trajectory builder's slots.
    """

    def __init__(
        self,
        league: League,
        agents: int,
        snapshot_every: int,
        snapshots: StackedModels,
        chooser: Policy,
        current_weights: Callable[[], dict[str, torch.Tensor]],
        seed: int,
        scripted: Mapping[int, Callable[[np.ndarray], np.ndarray]] | None = None,
    ) -> None:
        """``snapshots``: where the pool's snapshots are loaded to act (empty at first);
        ``chooser``: the agent's inference policy, whose ``choose`` turns their policy
        parameters into actions as the learning policy's own are; ``scripted``: the fixed
        opponents by pool id, each from raw observation rows to their actions."""
        self.league = league
        self.agents = agents
        self.snapshot_every = snapshot_every
        self.snapshots = snapshots
        self._chooser = chooser
        self._current_weights = current_weights
        self._rng = np.random.default_rng(seed)
        self._scripted = dict(scripted or {})
        self._next_snapshot = 0 if not league.pool.ids() else None
        """Learner step at which the next snapshot is due (None: one period from now)."""
        self.learner_agent_S = np.zeros(0, np.int64)
        """Which agent of the env the learning policy plays this episode."""
        self.opponent_S = np.zeros(0, np.int64)
        """The snapshot that plays the other agent this episode."""
        self.open_S = np.zeros(0, bool)
        """The env's episode is under way (seats drawn, not every agent ended yet)."""
        self.ended_S = np.zeros(0, np.int64)
        """Agents of the env whose episode ended since the seats were drawn."""
        self._env_B = np.zeros(0, np.int64)

    # ------------------------------------------------------------- snapshots

    def snapshot_due(self, learner_step: int) -> None:
        """Freeze the weights inference runs into the pool when a period has passed."""
        if self._next_snapshot is None:
            self._next_snapshot = learner_step + self.snapshot_every
        if learner_step < self._next_snapshot:
            return
        self.league.add(learner_step, self._current_weights())
        with self.league.lock:
            kept = set(self.league.pool.ids())
        self._next_snapshot = learner_step + self.snapshot_every
        playing = set(self.opponent_S[self.open_S].tolist())
        for snapshot_id in self.snapshots.members():
            if snapshot_id not in kept and snapshot_id not in playing:
                self.snapshots.remove(snapshot_id)

    # ------------------------------------------------------------- seats

    def reset(self, slot_ids: np.ndarray) -> None:
        """A new stream's envs: no episode under way (its slots may have served another)."""
        self._grow(int(slot_ids.max()) + 1)
        self.open_S[slot_ids] = False

    def seats(
        self, slot_B: np.ndarray, acting_B: np.ndarray, done_B: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(rows the learning policy plays, each row's env's opponent snapshot) for one
        batch; draws the seats of envs whose episode starts here."""
        rows = len(slot_B)
        a = self.agents
        env_B = slot_B[np.arange(rows) // a * a]
        self._env_B = env_B
        self._grow(int(env_B.max()) + 1)
        env_E = env_B[::a]
        starting_E = acting_B.reshape(-1, a).any(axis=1) & ~self.open_S[env_E]
        for env in env_E[starting_E].tolist():
            self._draw(env)
        self.ended_S[env_E] += done_B.reshape(-1, a).sum(axis=1)
        self.open_S[env_E] &= self.ended_S[env_E] < a
        learner_B = np.arange(rows) % a == self.learner_agent_S[env_B]
        return learner_B, self.opponent_S[env_B]

    def _draw(self, env: int) -> None:
        self.learner_agent_S[env] = self._rng.integers(self.agents)
        snapshot_id = self.league.opponent()
        if snapshot_id not in self.snapshots and snapshot_id not in self._scripted:
            with self.league.lock:
                weights = self.league.pool.weights(snapshot_id)
            self.snapshots.add(snapshot_id, weights)
        self.opponent_S[env] = snapshot_id
        self.open_S[env] = True
        self.ended_S[env] = 0

    def _grow(self, size: int) -> None:
        if size <= len(self.open_S):
            return
        size = max(size, 2 * len(self.open_S))

        def grown(arr: np.ndarray) -> np.ndarray:
            new = np.zeros(size, arr.dtype)
            new[: len(arr)] = arr
            return new

        self.learner_agent_S = grown(self.learner_agent_S)
        self.opponent_S = grown(self.opponent_S)
        self.open_S = grown(self.open_S)
        self.ended_S = grown(self.ended_S)

    # ------------------------------------------------------------- opponents' actions

    def act(
        self,
        obs_BO: np.ndarray,
        raw_BO: np.ndarray,
        slot_B: np.ndarray,
        opponent_B: np.ndarray,
        action_BA: np.ndarray,
        rows_B: np.ndarray,
    ) -> None:
        """Write into ``action_BA[rows_B]`` the opponents' actions: the snapshots' from
        one forward pass over all their rows (feed-forward policies: no state, no episode
        flags) on ``obs_BO`` as the learning policy sees it; a fixed opponent's from
        ``raw_BO``."""
        if not rows_B.any():
            return
        index = np.flatnonzero(rows_B)
        opponent_I = opponent_B[index]
        scripted_I = np.zeros(len(index), bool)
        for scripted_id, scripted in self._scripted.items():
            of_it = opponent_I == scripted_id
            if of_it.any():
                group = index[of_it]
                action_BA[group] = scripted(raw_BO[group]).reshape(action_BA[group].shape)
                scripted_I |= of_it
        group = index[~scripted_I]
        if len(group):
            params_BP = self.snapshots.act(obs_BO[group], opponent_B[group])
            actions = self._chooser.choose(params_BP, slot_B[group])
            action_BA[group] = actions.reshape(action_BA[group].shape)

    # ------------------------------------------------------------- results

    def finish(self, rows: np.ndarray, returns: np.ndarray) -> None:
        """The learning policy's agent ended its episode in batch rows ``rows`` with these
        returns: record each game against that env's opponent."""
        for row, episode_return in zip(rows.tolist(), returns.tolist(), strict=True):
            env = int(self._env_B[row])
            self.league.record(int(self.opponent_S[env]), outcome_of(episode_return))
