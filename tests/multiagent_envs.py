"""Scripted multi-agent envs with a known turn order (PettingZoo's APIs, duck-typed, so
the tests need nothing of PettingZoo itself).

:class:`TurnGame` (AEC): agents move in turn; after each move the mover receives its
action as reward and every other agent still in the game ``-move/10`` (so rewards also
arrive while an agent waits, and each is distinct). The agent ``leaver`` terminates on its
second move (PettingZoo's convention: it is then selected and must be stepped with None,
which removes it), and the game ends for everyone after ``length`` moves.

:class:`JoinLeave` (Parallel): ``a`` plays throughout, ``b`` joins at step 2, ``c`` leaves
(truncated) at step 3; the episode ends (terminated) at step 5. Each live agent's reward
is its action plus the step number.

Observations are ``[move or step number, agent index]`` (float32), actions Discrete(4).

:class:`MaskedChoices` (Parallel): MultiDiscrete actions under an action mask, for the
learner's masks of several agents.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

OBS = spaces.Box(-100.0, 100.0, (2,), np.float32)
ACTIONS = spaces.Discrete(4)


class TurnGame:
    def __init__(
        self, agents: tuple[str, ...] = ("a", "b", "c"), leaver: str | None = "c", length: int = 8
    ) -> None:
        self.metadata: dict[str, Any] = {}
        self.possible_agents = list(agents)
        self.leaver = leaver
        self.length = length

    def observation_space(self, agent: str) -> spaces.Space:
        return OBS

    def action_space(self, agent: str) -> spaces.Space:
        return ACTIONS

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        self.agents = list(self.possible_agents)
        self.moves = 0
        self.moves_of = dict.fromkeys(self.agents, 0)
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.agent_selection = self.agents[0]

    def observe(self, agent: str) -> np.ndarray:
        return np.array([self.moves, self.possible_agents.index(agent)], np.float32)

    def last(self) -> Any:  # what makes it an AEC env
        agent = self.agent_selection
        return (
            self.observe(agent), self.rewards[agent], self.terminations[agent],
            self.truncations[agent], {},
        )  # fmt: skip

    def step(self, action: Any) -> None:
        mover = self.agent_selection
        self.rewards = dict.fromkeys(self.agents, 0.0)
        if self.terminations[mover] or self.truncations[mover]:
            assert action is None, f"a dead agent is stepped with None, got {action!r}"
            index = self.agents.index(mover)
            self.agents.remove(mover)
            self.agent_selection = self.agents[index % len(self.agents)]
            return
        assert action is not None and 0 <= int(action) < 4, f"{mover} sent {action!r}"
        self.moves += 1
        self.moves_of[mover] += 1
        for agent in self.agents:
            self.rewards[agent] = float(action) if agent == mover else -self.moves / 10
        if self.moves >= self.length:
            self.terminations = dict.fromkeys(self.agents, True)
            return
        if mover == self.leaver and self.moves_of[mover] == 2:
            self.terminations[mover] = True  # selected again: must be stepped dead
            return
        self.agent_selection = self.agents[(self.agents.index(mover) + 1) % len(self.agents)]

    def close(self) -> None:
        pass


class JoinLeave:
    def __init__(self) -> None:
        self.metadata: dict[str, Any] = {}
        self.possible_agents = ["a", "b", "c"]

    def observation_space(self, agent: str) -> spaces.Space:
        return OBS

    def action_space(self, agent: str) -> spaces.Space:
        return ACTIONS

    def _obs(self) -> dict[str, np.ndarray]:
        return {
            a: np.array([self.t, self.possible_agents.index(a)], np.float32) for a in self.agents
        }

    def reset(self, seed: int | None = None, options: dict | None = None) -> Any:
        self.t = 0
        self.agents = ["a", "c"]
        return self._obs(), {}

    def step(self, actions: dict[str, Any]) -> Any:
        assert set(actions) == set(self.agents), f"actions for {sorted(actions)}"
        self.t += 1
        rewards = {a: float(actions[a]) + self.t for a in self.agents}
        terminated = dict.fromkeys(self.agents, self.t == 5)
        truncated = {a: a == "c" and self.t == 3 for a in self.agents}
        obs = self._obs()
        if self.t == 2:  # b joins: its first observation, no reward yet
            obs["b"] = np.array([self.t, 1], np.float32)
        if self.t == 5:
            self.agents = []
        else:
            self.agents = [a for a in self.agents if not truncated[a]]
            if self.t == 2:
                self.agents.insert(1, "b")
        return obs, rewards, terminated, truncated, {}

    def close(self) -> None:
        pass


MASKED_NVEC = (3, 4)
MASKED_OBS = spaces.Dict(
    {
        "action_mask": spaces.Box(0, 1, (sum(MASKED_NVEC),), np.int8),
        "observation": spaces.Box(-100.0, 100.0, (2,), np.float32),
    }
)
MASKED_ACTIONS = spaces.MultiDiscrete(list(MASKED_NVEC))


class MaskedChoices:
    """A Parallel env of two agents with MultiDiscrete([3, 4]) actions under an action mask
    of ``3 + 4`` entries (seedrl's flat layout): each agent may not repeat either element of
    its last action. Observations ``[step, agent index]``; the reward is the sum of the
    elements; both agents end (terminated) after 4 steps."""

    def __init__(self) -> None:
        self.metadata: dict[str, Any] = {}
        self.possible_agents = ["a", "b"]

    def observation_space(self, agent: str) -> spaces.Space:
        return MASKED_OBS

    def action_space(self, agent: str) -> spaces.Space:
        return MASKED_ACTIONS

    def _obs(self) -> dict[str, dict[str, np.ndarray]]:
        return {
            agent: {
                "action_mask": self.masks[agent].copy(),
                "observation": np.array([self.t, j], np.float32),
            }
            for j, agent in enumerate(self.possible_agents)
        }

    def reset(self, seed: int | None = None, options: dict | None = None) -> Any:
        self.t = 0
        self.agents = list(self.possible_agents)
        self.masks = {agent: np.ones(sum(MASKED_NVEC), np.int8) for agent in self.agents}
        return self._obs(), {agent: {} for agent in self.agents}

    def step(self, actions: dict[str, Any]) -> Any:
        assert set(actions) == set(self.agents), f"actions for {sorted(actions)}"
        for agent, action in actions.items():
            a0, a1 = (int(x) for x in np.asarray(action).reshape(2))
            assert self.masks[agent][a0] and self.masks[agent][3 + a1], f"{agent}: masked"
            self.masks[agent][:] = 1
            self.masks[agent][[a0, 3 + a1]] = 0
        self.t += 1
        rewards = {agent: float(np.sum(actions[agent])) for agent in self.agents}
        ended = dict.fromkeys(self.agents, self.t == 4)
        obs = self._obs()
        self.agents = [] if self.t == 4 else self.agents
        return obs, rewards, ended, dict.fromkeys(ended, False), {x: {} for x in ended}

    def close(self) -> None:
        pass


def turn_game(**kwargs: Any) -> TurnGame:
    """``module:callable`` factory (what a user's own PettingZoo env looks like to seedrl)."""
    return TurnGame(**kwargs)


def two_player(length: int = 6) -> TurnGame:
    """Two agents, nobody leaves early: a two-player game for self-play."""
    return TurnGame(agents=("a", "b"), leaver=None, length=length)


def scripted_player(obs: np.ndarray) -> int:
    """A ``--fixed-opponents module:callable`` for the turn games: always action 3."""
    assert obs.shape == (2,), f"one agent's observation, got {obs.shape}"
    return 3


TARGETS = {"a": 0, "b": 1}
"""Each agent's rewarded action in :class:`TwoTargets`."""


class TwoTargets:
    """A Parallel env of two agents with different scripted targets: each step an agent
    receives 1 for its own target action (a: 0, b: 1) and 0 otherwise; both end
    (terminated) after ``length`` steps. Observations ``[step, tag]``: the tag is the
    agent's index when ``tagged``, else 0, so untagged the agents look alike and only two
    networks can each learn their own target."""

    def __init__(self, tagged: bool = False, length: int = 4) -> None:
        self.metadata: dict[str, Any] = {}
        self.possible_agents = list(TARGETS)
        self.tagged = tagged
        self.length = length

    def observation_space(self, agent: str) -> spaces.Space:
        return OBS

    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Discrete(2)

    def _obs(self) -> dict[str, np.ndarray]:
        return {
            agent: np.array([self.t, j if self.tagged else 0], np.float32)
            for j, agent in enumerate(self.possible_agents)
        }

    def reset(self, seed: int | None = None, options: dict | None = None) -> Any:
        self.t = 0
        self.agents = list(self.possible_agents)
        return self._obs(), {agent: {} for agent in self.agents}

    def step(self, actions: dict[str, Any]) -> Any:
        assert set(actions) == set(self.agents), f"actions for {sorted(actions)}"
        self.t += 1
        rewards = {a: float(int(actions[a]) == TARGETS[a]) for a in self.agents}
        ended = dict.fromkeys(self.agents, self.t == self.length)
        obs = self._obs()
        self.agents = [] if self.t == self.length else self.agents
        return obs, rewards, ended, dict.fromkeys(ended, False), {a: {} for a in ended}

    def close(self) -> None:
        pass


def two_targets(tagged: bool = False, length: int = 4) -> TwoTargets:
    """``module:callable`` factory of :class:`TwoTargets`."""
    return TwoTargets(tagged, length)
