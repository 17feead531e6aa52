"""Models of the envs the suite offers: what one step does, what a reset looks like, and
which actions to send, so the actor-side cases can check each env's next frame.

A model predicts an env's next observation, reward and termination from the frame the
actor sent and the action the suite answered. CartPole-v1's model is gymnasium's own
``CartPoleEnv`` with its state set from the observation (the observation is the
state), so an actor in another language is held to gymnasium's dynamics, not to a
second copy of them. The probe envs (:mod:`seedrl.conformance.probe`) are exact by
design. Envs without a model still run every case that needs none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from seedrl.conformance import probe


@dataclass
class Transition:
    obs: np.ndarray
    reward: float
    terminated: bool
    decided_by_rounding: bool = False
    """The end condition is within rounding of the float32 observation: do not judge it."""


class EnvModel(Protocol):
    max_episode_steps: int | None
    """The env's time limit (steps), or None without one."""
    frame_stack: int
    """D when observations are D frames stacked by seedrl's rule (see seedrl.envs), else 1."""
    clips_box_actions_visibly: bool
    """True when an unclipped Box action would show in the next observation."""

    def step(self, obs: np.ndarray, action: np.ndarray) -> Transition: ...
    def is_reset(self, obs: np.ndarray) -> bool: ...
    def same(self, predicted: np.ndarray, actual: np.ndarray) -> bool: ...
    def choose(self, obs: np.ndarray, env_index: int, rng: np.random.Generator) -> Any:
        """The action the suite sends: env 0 is kept alive to its time limit, the others
        get varied actions so that actions applied to the wrong env show."""
        ...


class CartPoleModel:
    """gymnasium's CartPole-v1 dynamics (500-step time limit)."""

    max_episode_steps = 500
    frame_stack = 1
    clips_box_actions_visibly = False
    RESET_BOUND = 0.05

    def __init__(self) -> None:
        from gymnasium.envs.classic_control.cartpole import CartPoleEnv

        self._env = CartPoleEnv()
        self._x_limit = self._env.x_threshold
        self._theta_limit = self._env.theta_threshold_radians

    def step(self, obs: np.ndarray, action: np.ndarray) -> Transition:
        env = self._env
        env.state = np.asarray(obs, np.float64).copy()
        env.steps_beyond_terminated = None
        next_obs, reward, terminated, _, _ = env.step(int(action))
        x, theta = float(env.state[0]), float(env.state[2])
        borderline = min(abs(abs(x) - self._x_limit), abs(abs(theta) - self._theta_limit)) < 1e-5
        return Transition(next_obs, float(reward), bool(terminated), borderline)

    def is_reset(self, obs: np.ndarray) -> bool:
        return obs.shape == (4,) and bool(np.all(np.abs(obs) <= self.RESET_BOUND + 1e-6))

    def same(self, predicted: np.ndarray, actual: np.ndarray) -> bool:
        return predicted.shape == actual.shape and bool(
            np.allclose(predicted, actual, rtol=1e-5, atol=1e-5)
        )

    def choose(self, obs: np.ndarray, env_index: int, rng: np.random.Generator) -> Any:
        if env_index == 0:  # a linear controller that balances the pole for 500 steps
            x, x_dot, theta, theta_dot = (float(v) for v in obs)
            return int(theta + 0.5 * theta_dot + 0.02 * x + 0.1 * x_dot > 0)
        return int(rng.integers(2))


class StackedProbeModel:
    """:class:`~seedrl.conformance.probe.StackedProbe`: exact, 3 stacked uint8 frames."""

    max_episode_steps = probe.STACKED_TIME_LIMIT
    frame_stack = probe.STACK
    clips_box_actions_visibly = False

    def step(self, obs: np.ndarray, action: np.ndarray) -> Transition:
        a = int(action)
        position = int(obs[-1, 0]) + a - 1
        steps = int(obs[-1, 2]) + 1
        nxt = np.empty_like(obs)
        nxt[:-1] = obs[1:]
        nxt[-1] = (position, a, steps, probe.MARKER)
        terminated = not probe.END_LOW < position < probe.END_HIGH
        return Transition(nxt, float(a - 1), terminated)

    def is_reset(self, obs: np.ndarray) -> bool:
        if obs.shape != (probe.STACK, probe.FRAME) or obs[:-1].any():
            return False
        position, action, steps, marker = (int(v) for v in obs[-1])
        in_range = probe.START_LOW <= position <= probe.START_HIGH
        return in_range and (action, steps, marker) == (0, 0, probe.MARKER)

    def same(self, predicted: np.ndarray, actual: np.ndarray) -> bool:
        return predicted.shape == actual.shape and bool(np.array_equal(predicted, actual))

    def choose(self, obs: np.ndarray, env_index: int, rng: np.random.Generator) -> Any:
        if env_index == 0:  # stay inside the bounds until the time limit
            position = int(obs[-1, 0])
            safe = [
                a for a in (0, 1, 2) if probe.END_LOW + 1 < position + a - 1 < probe.END_HIGH - 1
            ]
            return int(rng.choice(safe))
        return int(rng.integers(3))


class BoxProbeModel:
    """:class:`~seedrl.conformance.probe.BoxProbe`: exact, Box actions it does not clip."""

    max_episode_steps = probe.BOX_TIME_LIMIT
    frame_stack = 1
    clips_box_actions_visibly = True

    def step(self, obs: np.ndarray, action: np.ndarray) -> Transition:
        a = np.clip(np.asarray(action, np.float32).reshape(2), probe.BOX_LOW, probe.BOX_HIGH)
        nxt = np.asarray(obs, np.float32).copy()
        nxt[0] = np.float32(nxt[0] + a[0] + a[1] - np.float32(1.0))
        nxt[1:3] = a
        nxt[3] += 1
        return Transition(nxt, float(-abs(nxt[0])), bool(abs(nxt[0]) > probe.BOX_BOUND))

    def is_reset(self, obs: np.ndarray) -> bool:
        return obs.shape == (4,) and abs(float(obs[0])) <= 0.5 and not obs[1:].any()

    def same(self, predicted: np.ndarray, actual: np.ndarray) -> bool:
        return predicted.shape == actual.shape and bool(
            np.allclose(predicted, actual, rtol=1e-6, atol=1e-6)
        )

    def choose(self, obs: np.ndarray, env_index: int, rng: np.random.Generator) -> Any:
        if env_index == 0:  # toward 0, with a first coordinate an actor must clip to its bound
            return np.array([3.0 if obs[0] < 0 else -3.0, 1.0], np.float32)
        return rng.uniform((-2.0, -1.0), (2.0, 3.0)).astype(np.float32)


class DictProbeModel:
    """:class:`~seedrl.conformance.probe.DictProbe`: exact; an observation is one record
    of the leaves (``obs["cells"]``, ``obs["pos"]``, ``obs["status.0"]``, ...)."""

    max_episode_steps = probe.DICT_TIME_LIMIT
    frame_stack = 1
    clips_box_actions_visibly = False

    def step(self, obs: np.ndarray, action: np.ndarray) -> Transition:
        a = int(action)
        nxt = np.array(obs, copy=True)  # a 0-d record of its own, whose fields take writes
        steps = int(obs["status.0"]) + 1
        nxt["pos"] = obs["pos"] + np.array((a - 1, 1), np.float32)
        nxt["cells"][1] = obs["cells"][0]
        nxt["cells"][0] = (a, steps, probe.DICT_MARKER)
        nxt["status.0"] = steps
        nxt["status.1"] = np.eye(3, dtype=np.int8)[a]
        terminated = bool(abs(nxt["pos"][0]) > probe.DICT_BOUND)
        return Transition(nxt, float(a - 1), terminated)

    def is_reset(self, obs: np.ndarray) -> bool:
        names = obs.dtype.names or ()
        if names != ("cells", "pos", "status.0", "status.1"):
            return False
        cells = obs["cells"]
        return (
            cells[1].tolist() == [0, 0, 0]
            and cells[0].tolist() == [0, 0, probe.DICT_MARKER]
            and abs(float(obs["pos"][0])) <= 1
            and float(obs["pos"][1]) == 0
            and int(obs["status.0"]) == 0
            and not obs["status.1"].any()
        )

    def same(self, predicted: np.ndarray, actual: np.ndarray) -> bool:
        return predicted.dtype == actual.dtype and all(
            np.array_equal(predicted[name], actual[name]) for name in predicted.dtype.names or ()
        )

    def choose(self, obs: np.ndarray, env_index: int, rng: np.random.Generator) -> Any:
        if env_index == 0:  # stay within the bounds until the time limit
            return 1 - int(np.sign(obs["pos"][0]))
        return int(rng.integers(3))


class MultiDiscreteProbeModel:
    """:class:`~seedrl.conformance.probe.MultiDiscreteProbe`: exact, MultiDiscrete actions."""

    max_episode_steps = probe.MULTI_TIME_LIMIT
    frame_stack = 1
    clips_box_actions_visibly = False

    def step(self, obs: np.ndarray, action: np.ndarray) -> Transition:
        a0, a1 = (int(x) for x in np.asarray(action).reshape(2))
        nxt = np.asarray(obs, np.float32).copy()
        nxt[0] += np.float32((a0 - 1) + (a1 - 2))
        nxt[1:3] = (a0, a1)
        nxt[3] += 1
        return Transition(nxt, float(-abs(nxt[0])), bool(abs(nxt[0]) > probe.MULTI_BOUND))

    def is_reset(self, obs: np.ndarray) -> bool:
        return obs.shape == (4,) and abs(float(obs[0])) <= 1 and not obs[1:].any()

    def same(self, predicted: np.ndarray, actual: np.ndarray) -> bool:
        return predicted.shape == actual.shape and bool(np.array_equal(predicted, actual))

    def choose(self, obs: np.ndarray, env_index: int, rng: np.random.Generator) -> Any:
        if env_index == 0:  # toward 0 through both elements, so each one's value shows
            move = [2, 2] if obs[0] < 0 else [0, 2] if obs[0] > 0 else [2, 1]
            return np.array(move, np.int64)
        return np.array([rng.integers(n) for n in probe.MULTI_NVEC], np.int64)


@dataclass
class AgentsFrame:
    """One env's rows of a multi-agent frame, as its model predicts them."""

    obs: list[dict[str, np.ndarray] | np.ndarray | None]
    """Each agent's observation (leaf name -> value for a dict space); None for an agent out
    of the episode (its observation is not judged)."""
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    acting: np.ndarray
    over: bool
    """Every agent has ended: the env's next frame is its reset frame."""
    state: Any = None
    """What the model needs to predict the frame after this one."""


class AgentsModel(Protocol):
    """A multi-agent env's model: one env's rows (agents in ``agents`` order) from its
    previous rows and the actions sent for them."""

    agents: tuple[str, ...]
    episode_frames: int
    """Frames from one reset frame to the next (the stream session serves a few)."""

    def reset(self) -> AgentsFrame: ...
    def step(self, before: AgentsFrame, actions_A: np.ndarray) -> AgentsFrame: ...
    def same(self, predicted: Any, actual: np.ndarray) -> bool: ...
    def choose(self, obs: np.ndarray, row: int, rng: np.random.Generator) -> Any:
        """The action the suite sends a row: an allowed one for the agent to move."""
        ...


class TurnProbeModel:
    """:class:`~seedrl.conformance.probe.TurnProbe`: exact, written from its rules (round
    robin among the agents still in, each ending on its own move count)."""

    agents: tuple[str, ...] = probe.TURN_AGENTS
    episode_frames: int = sum(probe.TURN_MOVES) + 1

    def _frame(
        self, moves: int, last: int, moves_of: tuple[int, ...], received: tuple[float, ...],
        next_mover: int, out: tuple[bool, ...], ended: int = -1,
    ) -> AgentsFrame:  # fmt: skip
        a = len(self.agents)
        obs: list[dict[str, np.ndarray] | np.ndarray | None] = []
        for j in range(a):
            mask = np.zeros(3, np.int8)
            if j == next_mover:
                mask[:] = 1
                if last >= 0:
                    mask[last] = 0
            values = (j, moves, last, received[j], *moves_of)
            row: dict[str, np.ndarray] = {
                "action_mask": mask,
                "observation": np.array(values, np.float32),
            }
            obs.append(None if out[j] else row)
        terminated, truncated = np.zeros(a, np.bool_), np.zeros(a, np.bool_)
        if ended >= 0:
            (truncated if ended == probe.TURN_TRUNCATED else terminated)[ended] = True
        acting = np.zeros(a, np.bool_)
        if next_mover >= 0:
            acting[next_mover] = True
        reward = np.array([0.0 if out[j] else received[j] for j in range(a)], np.float32)
        state = (moves, last, moves_of, received, next_mover, out, ended)
        return AgentsFrame(obs, reward, terminated, truncated, acting, next_mover < 0, state)

    def reset(self) -> AgentsFrame:
        a = len(self.agents)
        return self._frame(0, -1, (0,) * a, (0.0,) * a, 0, (False,) * a)

    def step(self, before: AgentsFrame, actions_A: np.ndarray) -> AgentsFrame:
        moves, _, moves_of, received, m, out, ended = before.state
        out = tuple(o or j == ended for j, o in enumerate(out))  # a final row was sent
        a = int(np.asarray(actions_A[m]))
        counts = list(moves_of)
        counts[m] += 1
        got = tuple(
            received[j] if out[j] else float(a - 1) if j == m else (1 - a) / 2
            for j in range(len(self.agents))
        )
        live = [j for j, n in enumerate(counts) if n < probe.TURN_MOVES[j]]
        following = [*range(m + 1, len(self.agents)), *range(m + 1)]
        next_mover = next((j for j in following if j in live), -1)
        finished = m if counts[m] == probe.TURN_MOVES[m] else -1
        return self._frame(moves + 1, a, tuple(counts), got, next_mover, out, finished)

    def same(self, predicted: Any, actual: np.ndarray) -> bool:
        return all(np.array_equal(value, actual[name]) for name, value in predicted.items())

    def choose(self, obs: np.ndarray, row: int, rng: np.random.Generator) -> Any:
        allowed = np.flatnonzero(obs["action_mask"])
        return int(rng.choice(allowed)) if len(allowed) else int(rng.integers(3))


class SimulProbeModel:
    """:class:`~seedrl.conformance.probe.SimulProbe`: exact, written from its rules (every
    agent in the episode acts at once, each joins and leaves after its own step count)."""

    agents: tuple[str, ...] = probe.SIMUL_AGENTS
    episode_frames: int = probe.SIMUL_LENGTH + 1

    def _frame(
        self, steps: int, acted: tuple[int, ...], received: tuple[float, ...],
        returns: tuple[float, ...],
    ) -> AgentsFrame:  # fmt: skip
        a = len(self.agents)
        joined = [probe.SIMUL_JOINS[j] <= steps for j in range(a)]
        ends = [probe.SIMUL_ENDS[j] == steps for j in range(a)]
        obs: list[dict[str, np.ndarray] | np.ndarray | None] = [
            np.array((j, steps, received[j], returns[j], *acted), np.float32)
            if joined[j] and steps <= probe.SIMUL_ENDS[j] else None
            for j in range(a)
        ]  # fmt: skip
        terminated = np.array([e and j != probe.SIMUL_TRUNCATED for j, e in enumerate(ends)])
        truncated = np.array([e and j == probe.SIMUL_TRUNCATED for j, e in enumerate(ends)])
        acting = np.array([probe.simul_live(j, steps) for j in range(a)])
        reward = np.array(
            [0.0 if o is None else received[j] for j, o in enumerate(obs)], np.float32
        )
        over = steps >= probe.SIMUL_LENGTH
        state = (steps, received, returns)
        return AgentsFrame(obs, reward, terminated, truncated, acting, over, state)

    def reset(self) -> AgentsFrame:
        a = len(self.agents)
        return self._frame(0, (-1,) * a, (0.0,) * a, (0.0,) * a)

    def step(self, before: AgentsFrame, actions_A: np.ndarray) -> AgentsFrame:
        steps, _, returns = before.state
        acted = tuple(
            int(np.asarray(actions_A[j])) if before.acting[j] else -1
            for j in range(len(self.agents))
        )
        total = sum(x for x in acted if x >= 0)
        received = tuple(0.0 if x < 0 else x - (total - x) / 2 for x in acted)
        returns = tuple(g + r for g, r in zip(returns, received, strict=True))
        return self._frame(steps + 1, acted, received, returns)

    def same(self, predicted: Any, actual: np.ndarray) -> bool:
        return predicted.shape == actual.shape and bool(np.array_equal(predicted, actual))

    def choose(self, obs: np.ndarray, row: int, rng: np.random.Generator) -> Any:
        return int(rng.integers(3))


AGENT_MODELS: dict[str, Callable[[], AgentsModel]] = {
    "seedrl.conformance.probe:TurnProbe": TurnProbeModel,
    "seedrl.conformance.probe:SimulProbe": SimulProbeModel,
}
"""Multi-agent env id -> its model."""


def agents_model_for(env_id: str, env_kwargs: dict[str, Any]) -> AgentsModel | None:
    """The model of this multi-agent env, or None."""
    make = AGENT_MODELS.get(env_id)
    return make() if make is not None and not env_kwargs else None


MODELS: dict[str, Callable[[], Any]] = {
    "CartPole-v1": CartPoleModel,
    "seedrl.conformance.probe:StackedProbe": StackedProbeModel,
    "seedrl.conformance.probe:BoxProbe": BoxProbeModel,
    "seedrl.conformance.probe:DictProbe": DictProbeModel,
    "seedrl.conformance.probe:MultiDiscreteProbe": MultiDiscreteProbeModel,
}
"""Env id -> its model, for the env's default kwargs."""


def model_for(env_id: str, env_kwargs: dict[str, Any]) -> EnvModel | None:
    """The model of this env, or None (no model, or kwargs that change the dynamics)."""
    make = MODELS.get(env_id)
    model: EnvModel | None = make() if make is not None and not env_kwargs else None
    return model
