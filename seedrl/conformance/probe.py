"""Probe environments: tiny deterministic envs whose every observation tells the
conformance suite what the actor did, for the rules CartPole cannot show.

``StackedProbe`` stacks D frames of uint8 the way Atari does in seedrl (each step shifts
the stack and appends the newest frame; an episode starts as zeros plus its first
frame), so an actor that can run Python envs can be checked on frame-once stacking.
``BoxProbe`` takes Box actions and does not clip them itself, so its observation shows
whether the actor clipped. Both report the action they applied, a step counter and the
position their dynamics moved, so one frame is enough to predict the next exactly
(:mod:`seedrl.conformance.models`). ``DictProbe`` has a dict observation with a nested
tuple (one tensor per leaf on the wire) and ``MultiDiscreteProbe`` a MultiDiscrete action,
for actors that run structured spaces. ``TurnProbe`` is a PettingZoo AEC game of three
agents with a known turn order and ``SimulProbe`` a Parallel game of three agents who act
at once, join and leave at known steps, for actors that run multi-agent envs. Name them as
``seedrl.conformance.probe:StackedProbe`` (and ``BoxProbe``, ``DictProbe``,
``MultiDiscreteProbe``, ``TurnProbe``, ``SimulProbe``).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

STACK = 3
"""Frames per StackedProbe observation."""
FRAME = 4
"""A StackedProbe frame: position, last action, steps taken, a marker byte."""
MARKER = 7
START_LOW, START_HIGH = 100, 104
"""A StackedProbe episode starts at a position in [START_LOW, START_HIGH]."""
END_LOW, END_HIGH = 96, 108
"""A StackedProbe episode terminates when its position leaves (END_LOW, END_HIGH)."""
STACKED_TIME_LIMIT = 12


class StackedProbe(gym.Env):
    """Observations ``uint8 [3, 4]``: the last three frames ``[position, last action,
    steps, 7]``, oldest first. Action ``a`` in {0, 1, 2} moves the position by ``a - 1``;
    the reward is ``a - 1``; the episode terminates when the position leaves (96, 108)
    and is truncated after 12 steps."""

    metadata = {"render_modes": []}  # noqa: RUF012

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(0, 255, (STACK, FRAME), np.uint8)
        self.action_space = gym.spaces.Discrete(3)
        self._stack = np.zeros((STACK, FRAME), np.uint8)
        self._position = START_LOW
        self._steps = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._position = int(self.np_random.integers(START_LOW, START_HIGH + 1))
        self._steps = 0
        self._stack[:] = 0
        self._stack[-1] = (self._position, 0, 0, MARKER)
        return self._stack.copy(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        a = int(action)
        if a not in (0, 1, 2):
            raise ValueError(f"StackedProbe: action {action!r} is not in Discrete(3)")
        self._position += a - 1
        self._steps += 1
        self._stack[:-1] = self._stack[1:]
        self._stack[-1] = (self._position, a, self._steps, MARKER)
        terminated = not END_LOW < self._position < END_HIGH
        truncated = self._steps >= STACKED_TIME_LIMIT
        return self._stack.copy(), float(a - 1), terminated, truncated, {}


BOX_LOW = np.array([-1.0, 0.0], np.float32)
BOX_HIGH = np.array([1.0, 2.0], np.float32)
BOX_BOUND = 4.0
"""A BoxProbe episode terminates when |position| exceeds this."""
BOX_TIME_LIMIT = 10


class BoxProbe(gym.Env):
    """Observations ``float32 [4]``: ``[position, applied action 0, applied action 1,
    steps]``. Actions ``float32 [2]`` in ``[-1, 1] x [0, 2]``, applied as given (an actor
    must clip): the position moves by ``a0 + a1 - 1``, the reward is ``-|position|``;
    the episode terminates when ``|position| > 4`` and is truncated after 10 steps."""

    metadata = {"render_modes": []}  # noqa: RUF012

    def __init__(self) -> None:
        inf = np.float32(np.inf)
        self.observation_space = gym.spaces.Box(-inf, inf, (4,), np.float32)
        self.action_space = gym.spaces.Box(BOX_LOW, BOX_HIGH, dtype=np.float32)
        self._obs = np.zeros(4, np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._obs[:] = (self.np_random.uniform(-0.5, 0.5), 0.0, 0.0, 0.0)
        return self._obs.copy(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        a = np.asarray(action, np.float32).reshape(2)
        obs = self._obs
        obs[0] = np.float32(obs[0] + a[0] + a[1] - np.float32(1.0))
        obs[1:3] = a
        obs[3] += 1
        terminated = bool(abs(obs[0]) > BOX_BOUND)
        truncated = bool(obs[3] >= BOX_TIME_LIMIT)
        return obs.copy(), float(-abs(obs[0])), terminated, truncated, {}


DICT_BOUND = 3.0
"""A DictProbe episode terminates when |position| exceeds this."""
DICT_TIME_LIMIT = 10
DICT_MARKER = 9


class DictProbe(gym.Env):
    """A dict observation with a nested tuple, four leaves of four kinds and dtypes:
    ``cells`` ``uint8 [2, 3]`` (row 0: last action, steps, 9; row 1: row 0 one step
    before), ``pos`` ``float32 [2]`` (position, steps), ``status.0`` ``Discrete(16)`` (steps)
    and ``status.1`` ``MultiBinary(3)`` (the last action, one-hot). Action ``a`` in
    {0, 1, 2} moves the position by ``a - 1``, the reward is ``a - 1``; the episode
    terminates when |position| exceeds 3 and is truncated after 10 steps."""

    metadata = {"render_modes": []}  # noqa: RUF012

    def __init__(self) -> None:
        inf = np.float32(np.inf)
        self.observation_space = gym.spaces.Dict(
            {
                "cells": gym.spaces.Box(0, 255, (2, 3), np.uint8),
                "pos": gym.spaces.Box(-inf, inf, (2,), np.float32),
                "status": gym.spaces.Tuple((gym.spaces.Discrete(16), gym.spaces.MultiBinary(3))),
            }
        )
        self.action_space = gym.spaces.Discrete(3)
        self._cells = np.zeros((2, 3), np.uint8)
        self._pos = np.zeros(2, np.float32)
        self._steps = 0
        self._last = np.zeros(3, np.int8)

    def _observe(self) -> dict[str, Any]:
        return {
            "cells": self._cells.copy(),
            "pos": self._pos.copy(),
            "status": (self._steps, self._last.copy()),
        }

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        self._steps = 0
        self._cells[:] = 0
        self._cells[0] = (0, 0, DICT_MARKER)
        self._pos[:] = (float(self.np_random.integers(-1, 2)), 0.0)
        self._last[:] = 0
        return self._observe(), {}

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        a = int(action)
        if a not in (0, 1, 2):
            raise ValueError(f"DictProbe: action {action!r} is not in Discrete(3)")
        self._steps += 1
        self._pos += np.array((a - 1, 1), np.float32)
        self._cells[1] = self._cells[0]
        self._cells[0] = (a, self._steps, DICT_MARKER)
        self._last[:] = 0
        self._last[a] = 1
        terminated = bool(abs(self._pos[0]) > DICT_BOUND)
        truncated = self._steps >= DICT_TIME_LIMIT
        return self._observe(), float(a - 1), terminated, truncated, {}


MULTI_NVEC = (3, 4)
MULTI_BOUND = 4.0
"""A MultiDiscreteProbe episode terminates when |position| exceeds this."""
MULTI_TIME_LIMIT = 10


class MultiDiscreteProbe(gym.Env):
    """Observations ``float32 [4]``: ``[position, action 0, action 1, steps]``. Actions
    ``MultiDiscrete([3, 4])``: the position moves by ``(a0 - 1) + (a1 - 2)``, the reward
    is ``-|position|``; the episode terminates when |position| exceeds 4 and is truncated
    after 10 steps."""

    metadata = {"render_modes": []}  # noqa: RUF012

    def __init__(self) -> None:
        inf = np.float32(np.inf)
        self.observation_space = gym.spaces.Box(-inf, inf, (4,), np.float32)
        self.action_space = gym.spaces.MultiDiscrete(list(MULTI_NVEC))
        self._obs = np.zeros(4, np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._obs[:] = (float(self.np_random.integers(-1, 2)), 0.0, 0.0, 0.0)
        return self._obs.copy(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        a = np.asarray(action).reshape(-1)
        if a.shape != (2,) or not all(0 <= int(x) < n for x, n in zip(a, MULTI_NVEC, strict=True)):
            raise ValueError(f"MultiDiscreteProbe: action {action!r} is not in {MULTI_NVEC}")
        obs = self._obs
        obs[0] += np.float32((int(a[0]) - 1) + (int(a[1]) - 2))
        obs[1:3] = a
        obs[3] += 1
        terminated = bool(abs(obs[0]) > MULTI_BOUND)
        truncated = bool(obs[3] >= MULTI_TIME_LIMIT)
        return obs.copy(), float(-abs(obs[0])), terminated, truncated, {}


TURN_AGENTS = ("p0", "p1", "p2")
TURN_MOVES = (2, 3, 4)
"""Moves each agent makes before its episode ends: they finish at different times."""
TURN_TRUNCATED = 2
"""The agent whose end is a time limit (truncated); the others' ends are terminations."""
TURN_OBS = 4 + len(TURN_AGENTS)
"""A TurnProbe observation: agent index, moves, last action, reward received, each
agent's moves."""

try:  # a real PettingZoo env where PettingZoo is installed; its API alone otherwise
    from pettingzoo import AECEnv as _AECBase
except ImportError:  # pragma: no cover - seedrl's actors need only the duck-typed API
    _AECBase = object


class _SameSpacesForAll:
    """The part of PettingZoo's API both multi-agent probes share: every agent has the
    same two spaces."""

    agents: list[str]
    possible_agents: list[str]
    _observation_space: gym.spaces.Space
    _action_space: gym.spaces.Space

    def observation_space(self, agent: str) -> gym.spaces.Space:
        return self._observation_space

    def action_space(self, agent: str) -> gym.spaces.Space:
        return self._action_space

    @property
    def num_agents(self) -> int:
        return len(self.agents)

    @property
    def max_num_agents(self) -> int:
        return len(self.possible_agents)


class TurnProbe(_SameSpacesForAll, _AECBase):
    """A PettingZoo AEC game of three agents ``p0, p1, p2`` who move in turn (round robin
    among those still in). Action ``a`` in {0, 1, 2}: the mover receives ``a - 1``, every
    other agent still in ``(1 - a) / 2``. An agent's episode ends on its own 2nd, 3rd, 4th
    move (``p0`` and ``p1`` terminated, ``p2`` truncated); PettingZoo's convention then
    selects it to be stepped dead (``step(None)``), and once all have ended the game is
    over. Observations are a dict: ``action_mask`` ``int8 [3]`` (the agent to move may play
    anything but the last action played; everyone else nothing) and ``observation``
    ``float32 [7]`` ``[agent index, moves, last action (-1 at first), reward received from
    the last move, moves of p0, p1, p2]``, so each row's frame shows the action applied,
    the rewards and whose turn it is."""

    metadata = {"render_modes": [], "name": "turn_probe_v0"}  # noqa: RUF012

    def __init__(self) -> None:
        super().__init__()
        self.possible_agents = list(TURN_AGENTS)
        self._observation_space = gym.spaces.Dict(
            {
                "action_mask": gym.spaces.Box(0, 1, (3,), np.int8),
                "observation": gym.spaces.Box(-100.0, 100.0, (TURN_OBS,), np.float32),
            }
        )
        self._action_space = gym.spaces.Discrete(3)
        self.reset()

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        self.agents = list(self.possible_agents)
        self._moves = 0
        self._last = -1
        self._moves_of = [0] * len(TURN_AGENTS)
        self._received = [0.0] * len(TURN_AGENTS)
        self._next = 0
        """The agent to move (by the game's rule, whatever dead steps are pending); -1: over."""
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos: dict[str, dict[str, Any]] = {agent: {} for agent in self.agents}
        self.agent_selection = self.agents[0]

    def observe(self, agent: str) -> dict[str, np.ndarray]:
        j = TURN_AGENTS.index(agent)
        mask = np.zeros(3, np.int8)
        if j == self._next:
            mask[:] = 1
            if self._last >= 0:
                mask[self._last] = 0
        values = (j, self._moves, self._last, self._received[j], *self._moves_of)
        return {"action_mask": mask, "observation": np.array(values, np.float32)}

    def last(self, observe: bool = True) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        agent = self.agent_selection
        return (
            self.observe(agent) if observe else None, self._cumulative_rewards[agent],
            self.terminations[agent], self.truncations[agent], self.infos[agent],
        )  # fmt: skip

    def step(self, action: Any) -> None:
        mover = self.agent_selection
        if self.terminations[mover] or self.truncations[mover]:
            if action is not None:
                raise ValueError(f"TurnProbe: {mover} has ended; step it with None")
            self._remove(mover)
            return
        a = int(action)
        if a not in (0, 1, 2):
            raise ValueError(f"TurnProbe: action {action!r} is not in Discrete(3)")
        m = TURN_AGENTS.index(mover)
        self._cumulative_rewards[mover] = 0.0
        self._moves += 1
        self._moves_of[m] += 1
        self._last = a
        for agent in self.agents:
            j = TURN_AGENTS.index(agent)
            self._received[j] = float(a - 1) if j == m else (1 - a) / 2
            self.rewards[agent] = self._received[j]
            self._cumulative_rewards[agent] += self._received[j]
        live = [j for j, n in enumerate(self._moves_of) if n < TURN_MOVES[j]]
        self._next = next((j for j in (*range(m + 1, 3), *range(m + 1)) if j in live), -1)
        if self._moves_of[m] == TURN_MOVES[m]:  # selected again: it is stepped dead next
            ends = self.truncations if m == TURN_TRUNCATED else self.terminations
            ends[mover] = True
        else:
            self.agent_selection = TURN_AGENTS[self._next]

    def _remove(self, agent: str) -> None:
        """PettingZoo's dead step: the agent leaves, the next one in turn is selected, the
        step's rewards are cleared (they were the move's)."""
        self.agents.remove(agent)
        for table in (self.rewards, self._cumulative_rewards, self.terminations,
                      self.truncations, self.infos):  # fmt: skip
            del table[agent]
        self.rewards = dict.fromkeys(self.agents, 0.0)
        if self.agents:
            self.agent_selection = TURN_AGENTS[self._next]

    def render(self) -> None:
        return None

    def close(self) -> None:
        pass


SIMUL_AGENTS = ("s0", "s1", "s2")
SIMUL_JOINS = (0, 0, 2)
"""The step after which each agent is in the episode: s2 joins after the second step."""
SIMUL_ENDS = (5, 3, 6)
"""The step whose outcome ends each agent's episode: they leave at different times."""
SIMUL_TRUNCATED = 0
"""The agent whose end is a time limit (truncated); the others' ends are terminations."""
SIMUL_LENGTH = max(SIMUL_ENDS)
SIMUL_OBS = 4 + len(SIMUL_AGENTS)
"""A SimulProbe observation: agent index, steps, reward received, return, each agent's
last action."""

try:  # a real PettingZoo env where PettingZoo is installed; its API alone otherwise
    from pettingzoo import ParallelEnv as _ParallelBase
except ImportError:  # pragma: no cover - seedrl's actors need only the duck-typed API
    _ParallelBase = object


def simul_live(j: int, steps: int) -> bool:
    """Whether agent j acts after ``steps`` steps of a SimulProbe episode."""
    return SIMUL_JOINS[j] <= steps < SIMUL_ENDS[j]


class SimulProbe(_SameSpacesForAll, _ParallelBase):
    """A PettingZoo Parallel game of three agents ``s0, s1, s2`` who act at once. ``s0``
    and ``s1`` start; ``s2`` joins after step 2 (its first observation, reward 0); ``s1``
    is terminated by step 3, ``s0`` truncated by step 5 and ``s2`` terminated by step 6,
    which ends the episode. Actions are Discrete(3); of the agents acting at a step, agent
    j receives ``a_j - (sum of the others' actions) / 2``, so every reward depends on every
    action sent. Observations are ``float32 [7]`` ``[agent index, steps, reward received
    from the last step, return so far, last action of s0, s1, s2 (-1 where one did not
    act)]``, so each row's frame shows the actions applied to every agent."""

    metadata = {"render_modes": [], "name": "simul_probe_v0"}  # noqa: RUF012

    def __init__(self) -> None:
        super().__init__()
        self.possible_agents = list(SIMUL_AGENTS)
        self._observation_space = gym.spaces.Box(-100.0, 100.0, (SIMUL_OBS,), np.float32)
        self._action_space = gym.spaces.Discrete(3)
        self.agents: list[str] = []
        self._steps = 0
        self._acted = [-1] * len(SIMUL_AGENTS)
        self._received = [0.0] * len(SIMUL_AGENTS)
        self._returns = [0.0] * len(SIMUL_AGENTS)

    def _observe(self, agent: str) -> np.ndarray:
        j = SIMUL_AGENTS.index(agent)
        values = (j, self._steps, self._received[j], self._returns[j], *self._acted)
        return np.array(values, np.float32)

    def _live(self) -> list[str]:
        return [x for j, x in enumerate(SIMUL_AGENTS) if simul_live(j, self._steps)]

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, dict[str, Any]]]:
        self._steps = 0
        self._acted = [-1] * len(SIMUL_AGENTS)
        self._received = [0.0] * len(SIMUL_AGENTS)
        self._returns = [0.0] * len(SIMUL_AGENTS)
        self.agents = self._live()
        return {x: self._observe(x) for x in self.agents}, {x: {} for x in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict[str, Any], ...]:
        if set(actions) != set(self.agents):
            raise ValueError(f"SimulProbe: actions for {sorted(actions)}, but {self.agents} act")
        acted = {SIMUL_AGENTS.index(x): int(a) for x, a in actions.items()}
        if not all(a in (0, 1, 2) for a in acted.values()):
            raise ValueError(f"SimulProbe: actions {actions!r} are not all in Discrete(3)")
        self._steps += 1
        self._acted = [acted.get(j, -1) for j in range(len(SIMUL_AGENTS))]
        total = sum(acted.values())
        self._received = [0.0] * len(SIMUL_AGENTS)
        for j, a in acted.items():
            self._received[j] = a - (total - a) / 2
            self._returns[j] += self._received[j]
        t = self._steps
        present = [  # the agents that acted, and one that joins now
            x for j, x in enumerate(SIMUL_AGENTS) if j in acted or SIMUL_JOINS[j] == t
        ]
        obs = {x: self._observe(x) for x in present}
        rewards = {x: self._received[SIMUL_AGENTS.index(x)] for x in present}
        ends = {x: SIMUL_ENDS[SIMUL_AGENTS.index(x)] == t for x in present}
        truncated = SIMUL_AGENTS[SIMUL_TRUNCATED]
        terminations = {x: end and x != truncated for x, end in ends.items()}
        truncations = {x: end and x == truncated for x, end in ends.items()}
        self.agents = self._live()
        return obs, rewards, terminations, truncations, {x: {} for x in present}

    def render(self) -> None:
        return None

    def close(self) -> None:
        pass
