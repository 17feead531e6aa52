"""Multi-agent envs (PettingZoo's AEC and Parallel APIs) as rows of one frame.

Each agent of each env is a row: K envs of A agents step as ``K * A`` rows, env-major
(row ``i * A + j`` is env i's agent j), and an ``acting`` flag per row says whose action
the env applies after this frame. The rules, which the wire protocol repeats
(docs/wire-protocol.md, "Several agents"):

* **Turns.** A Parallel env's live agents all act every step. An AEC env (a board game)
  is played by its own turn order: only ``agent_selection`` acts, the others wait; an
  agent that must be stepped dead (terminated or truncated while others play on) is
  stepped with ``None`` here, never by the learner.
* **Rewards.** A row's reward is what that agent received from the env step just taken
  (PettingZoo's ``rewards``), whether it acted or not; the learner adds up what arrives
  while an agent waits and credits it to that agent's last action.
* **Episode ends.** An agent whose episode ends sends its final observation once with
  ``terminated`` or ``truncated`` (not acting); until the env starts a new episode its
  row carries reward 0, flags clear, not acting. When every agent has ended, the next
  step resets the env (gymnasium's NEXT_STEP autoreset): a reset frame, rewards 0, flags
  clear, the agents to move acting.

Homogeneous agents only: every agent must have the same observation and action spaces
(one policy serves them all); anything else is refused in one line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from seedrl import codec
from seedrl.envs.family import EnvError


def is_multi_agent(env: Any) -> bool:
    """A PettingZoo env (AEC or Parallel): it names its agents."""
    return hasattr(env, "possible_agents") and not isinstance(env, gym.Env)


def _is_aec(env: Any) -> bool:
    """AEC (turn by turn: ``last`` and ``observe``) rather than Parallel; read off the class,
    since PettingZoo's wrappers refuse attribute reads before the first reset."""
    return callable(getattr(type(env), "last", None))


def agent_spaces(env_id: str, env: Any) -> tuple[tuple[str, ...], gym.Space, gym.Space]:
    """The agent ids and the one observation and action space they share, or EnvError."""
    agents = tuple(str(a) for a in env.possible_agents)
    if not agents:
        raise EnvError(f"{env_id}: the env names no agents (possible_agents is empty)")
    obs, act = env.observation_space(agents[0]), env.action_space(agents[0])
    for agent in agents[1:]:
        if env.observation_space(agent) != obs or env.action_space(agent) != act:
            raise EnvError(
                f"{env_id}: agents {agents[0]!r} and {agent!r} have different spaces; seedrl "
                "serves agents that share one policy (same observation and action spaces)"
            )
    return agents, obs, act


class AgentsEnv(gym.Env):
    """One multi-agent env as the learner describes it: the agents' shared spaces and ids.

    Stepping it as a single-agent env has no meaning; actors step :class:`AgentEnvs`, and
    tools that play games take the PettingZoo env itself from :attr:`env`.
    """

    def __init__(self, env_id: str, env: Any) -> None:
        self.env = env
        self.agent_ids, self.observation_space, self.action_space = agent_spaces(env_id, env)
        self.metadata = dict(getattr(env, "metadata", {}) or {})
        self.render_mode = getattr(env, "render_mode", None)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        raise TypeError("a multi-agent env is stepped by seedrl.envs.agents.AgentEnvs")

    def step(self, action: Any) -> Any:
        raise TypeError("a multi-agent env is stepped by seedrl.envs.agents.AgentEnvs")

    def close(self) -> None:
        self.env.close()


class AgentEnvs(gym.vector.VectorEnv):
    """K multi-agent envs stepped as ``K * A`` rows in NEXT_STEP autoreset mode.

    Like :class:`~seedrl.envs.vector.ScalarEnvs`, the arrays returned are reused by the
    next step. ``step`` takes one action per row (a waiting row's is ignored) and
    :attr:`acting` says, after each ``reset`` and ``step``, which rows act next.
    """

    def __init__(self, env_id: str, env_fns: Sequence[Callable[[], Any]]) -> None:
        self.envs = [make() for make in env_fns]
        self.agent_ids, space, action_space = agent_spaces(env_id, self.envs[0])
        self.num_agents = len(self.agent_ids)
        self.num_envs = len(self.envs)
        self.num_rows = self.num_envs * self.num_agents
        spec = codec.space_to_spec(space)
        self.single_observation_space = space
        self.single_action_space = action_space
        self.observation_space = gym.vector.utils.batch_space(space, self.num_rows)
        self.action_space = gym.vector.utils.batch_space(action_space, self.num_rows)
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}
        self.render_mode = None
        self._spec = spec
        self._leaves_R = [
            np.zeros((self.num_rows, *x.shape), x.dtype) for x in codec.space_leaves(spec)
        ]
        self._observations = codec.unflatten_values(spec, self._leaves_R)
        self.rewards = np.zeros(self.num_rows, np.float32)
        self.terminated = np.zeros(self.num_rows, np.bool_)
        self.truncated = np.zeros(self.num_rows, np.bool_)
        self.acting = np.zeros(self.num_rows, np.bool_)
        """Rows whose action the env applies at the next ``step``."""
        self._ended = np.zeros(self.num_rows, np.bool_)
        """Rows whose agent's episode ended (final row sent) in the env's current episode."""
        self._autoreset = [False] * self.num_envs

    # -------------------------------------------------------------- the vector API

    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset every env; an int seed seeds env i with seed + i."""
        if seed is None or isinstance(seed, int):
            seeds = [None if seed is None else seed + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
        for i, env_seed in enumerate(seeds):
            self._reset_env(i, env_seed)
        return self._observations, {}

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """One step of every env (the acting rows' actions); an env whose agents all
        ended on the previous step resets instead."""
        for i, env in enumerate(self.envs):
            if self._autoreset[i]:
                self._reset_env(i, None)
            elif _is_aec(env):
                self._step_aec(i, env, actions)
            else:
                self._step_parallel(i, env, actions)
        return self._observations, self.rewards, self.terminated, self.truncated, {}

    def episode_over(self, i: int) -> bool:
        """Whether every agent of env i has ended its episode (its next step resets it)."""
        return self._autoreset[i]

    def close_extras(self, **kwargs: Any) -> None:
        for env in self.envs:
            env.close()

    # -------------------------------------------------------------- one env

    def _rows(self, i: int) -> range:
        return range(i * self.num_agents, (i + 1) * self.num_agents)

    def _put(self, row: int, obs: Any) -> None:
        for leaf_R, value in zip(
            self._leaves_R, codec.flatten_values(self._spec, obs), strict=True
        ):
            leaf_R[row] = value

    def _reset_env(self, i: int, seed: int | None) -> None:
        env, rows = self.envs[i], self._rows(i)
        span = slice(rows.start, rows.stop)
        self.rewards[span] = 0.0
        self.terminated[span] = False
        self.truncated[span] = False
        self._ended[span] = False
        self._autoreset[i] = False
        if _is_aec(env):
            env.reset(seed=seed)
            for row, agent in zip(rows, self.agent_ids, strict=True):
                self._put(row, env.observe(agent))
            self._aec_turn(i, env)
            return
        obs, _ = env.reset(seed=seed)
        live = set(env.agents)
        for row, agent in zip(rows, self.agent_ids, strict=True):
            if agent in obs:
                self._put(row, obs[agent])
            self.acting[row] = agent in live

    def _step_aec(self, i: int, env: Any, actions: Any) -> None:
        rows = self._rows(i)
        mover = self.agent_ids.index(env.agent_selection)
        env.step(row_of(actions, rows.start + mover))
        for row, agent in zip(rows, self.agent_ids, strict=True):
            if self._ended[row]:
                self._wait(row)
                continue
            self.rewards[row] = env.rewards.get(agent, 0.0)
            self.terminated[row] = bool(env.terminations.get(agent, False))
            self.truncated[row] = bool(env.truncations.get(agent, False))
            self._put(row, env.observe(agent))
            self._ended[row] = self.terminated[row] or self.truncated[row]
        self._aec_turn(i, env)

    def _aec_turn(self, i: int, env: Any) -> None:
        """Step agents that must be stepped dead, then mark who moves (nobody once all ended:
        the next step resets)."""
        rows = self._rows(i)
        span = slice(rows.start, rows.stop)
        if self._ended[span].all() or not env.agents:
            self._autoreset[i] = True
            self.acting[span] = False
            return
        while env.agents and (
            env.terminations.get(env.agent_selection) or env.truncations.get(env.agent_selection)
        ):
            env.step(None)
        for row, agent in zip(rows, self.agent_ids, strict=True):
            self.acting[row] = (
                bool(env.agents) and agent == env.agent_selection and not self._ended[row]
            )
        if not self.acting[span].any():
            self._autoreset[i] = True

    def _step_parallel(self, i: int, env: Any, actions: Any) -> None:
        rows = self._rows(i)
        moves = {
            agent: row_of(actions, row)
            for row, agent in zip(rows, self.agent_ids, strict=True)
            if self.acting[row]
        }
        obs, rewards, terminations, truncations, _ = env.step(moves)
        live = set(env.agents)
        for row, agent in zip(rows, self.agent_ids, strict=True):
            if self._ended[row] or agent not in obs:
                self._wait(row)
                continue
            self._put(row, obs[agent])
            self.rewards[row] = rewards.get(agent, 0.0)
            self.terminated[row] = bool(terminations.get(agent, False))
            self.truncated[row] = bool(truncations.get(agent, False))
            self._ended[row] = self.terminated[row] or self.truncated[row]
            self.acting[row] = agent in live and not self._ended[row]
        if not live:
            self._autoreset[i] = True
            self.acting[rows.start : rows.stop] = False

    def _wait(self, row: int) -> None:
        """A row whose agent is not in the episode now: reward 0, flags clear, not acting."""
        self.rewards[row] = 0.0
        self.terminated[row] = False
        self.truncated[row] = False
        self.acting[row] = False


def row_of(values: Any, row: int) -> Any:
    """Row ``row`` of a batch of actions or observations (dicts and tuples of arrays for
    structured ones)."""
    if isinstance(values, dict):
        return {key: row_of(value, row) for key, value in values.items()}
    if isinstance(values, tuple):
        return tuple(row_of(value, row) for value in values)
    return values[row]


AgentChooser = Callable[[int, Any], Any]
"""``(agent index, that agent's observation) -> its action``: who plays every agent."""


@dataclass(frozen=True)
class AgentsEpisode:
    """One episode of a multi-agent env played by one chooser for every agent."""

    returns: np.ndarray
    """``[A]``: each agent's sum of rewards over the episode."""
    steps: int
    """Env steps taken (a Parallel env's joint steps, an AEC game's turns)."""
    ended: bool
    """Every agent ended before the step cap (else the returns are partial)."""

    @property
    def agent_mean(self) -> float:
        """The mean over agents of their episode returns: the per-agent return."""
        return float(self.returns.mean())

    @property
    def team(self) -> float:
        """The sum over agents of their episode returns: the team's return."""
        return float(self.returns.sum())


def play_episode(
    envs: AgentEnvs,
    choose: AgentChooser,
    seed: int | None,
    max_steps: int,
    on_step: Callable[[], None] | None = None,
) -> AgentsEpisode:
    """One episode of the single env of ``envs`` from ``reset(seed)``, every acting agent's
    action from ``choose`` (evaluation and baselines score all agents by one rule this
    way); ``on_step`` runs before each step (a video's frame)."""
    if envs.num_envs != 1:
        raise ValueError(f"play_episode steps one env, got {envs.num_envs}")
    obs, _ = envs.reset(seed=seed)
    returns_A = np.zeros(envs.num_agents, np.float64)
    actions_R: list[Any] = [0] * envs.num_rows  # a waiting row's action is ignored
    for steps in range(1, max_steps + 1):
        if on_step is not None:
            on_step()
        for row in np.flatnonzero(envs.acting):
            actions_R[row] = choose(int(row), row_of(obs, int(row)))
        obs, rewards_R, _, _, _ = envs.step(actions_R)
        returns_A += rewards_R
        if envs.episode_over(0):
            return AgentsEpisode(returns_A, steps, True)
    return AgentsEpisode(returns_A, max_steps, False)
