"""Small gymnasium envs with the spaces users bring: a dict observation, an action mask, a
MultiDiscrete action, a Dict action. Each is learnable in a few thousand frames, so the
end-to-end tests can check learning, and each refuses a masked (or malformed) action, so a
test run fails if one is sent.

Actors build them as ``spaces_envs:<factory>`` with ``tests/`` on ``PYTHONPATH``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

EPISODE_STEPS = 8


class _Episodic(gym.Env):
    """Ends every episode (terminated) after EPISODE_STEPS steps."""

    def __init__(self) -> None:
        self._rng = np.random.default_rng()
        self._steps = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._steps = 0
        self._draw()
        return self._observe(), {}

    def step(self, action: Any):
        reward = self._reward(action)
        self._steps += 1
        self._draw()
        return self._observe(), reward, self._steps >= EPISODE_STEPS, False, {}

    def _draw(self) -> None:
        raise NotImplementedError

    def _observe(self) -> Any:
        raise NotImplementedError

    def _reward(self, action: Any) -> float:
        raise NotImplementedError


class MaskedChoice(_Episodic):
    """Pick the cued action among the allowed ones: reward 1 when right. The mask allows the
    cue and a random set of others; a masked action is a bug, and raises."""

    def __init__(self, num_actions: int = 6) -> None:
        super().__init__()
        self.n = num_actions
        self.observation_space = spaces.Dict(
            {
                "action_mask": spaces.MultiBinary(num_actions),
                "cue": spaces.Box(0.0, 1.0, (num_actions,), np.float32),
            }
        )
        self.action_space = spaces.Discrete(num_actions)

    def _draw(self) -> None:
        self._target = int(self._rng.integers(self.n))
        self._mask = (self._rng.random(self.n) < 0.5).astype(np.int8)
        self._mask[self._target] = 1

    def _observe(self) -> dict[str, np.ndarray]:
        cue = np.zeros(self.n, np.float32)
        cue[self._target] = 1.0
        return {"action_mask": self._mask.copy(), "cue": cue}

    def _reward(self, action: Any) -> float:
        if not self._mask[int(action)]:
            raise ValueError(f"masked action {int(action)} taken (mask {self._mask.tolist()})")
        return float(int(action) == self._target)


class MultiChoice(_Episodic):
    """Two cued choices at once (MultiDiscrete [3, 4]): 0.5 reward for each one right."""

    NVEC = (3, 4)

    def __init__(self) -> None:
        super().__init__()
        self.observation_space = spaces.Box(0.0, 1.0, (sum(self.NVEC),), np.float32)
        self.action_space = spaces.MultiDiscrete(self.NVEC)

    def _draw(self) -> None:
        self._targets = [int(self._rng.integers(n)) for n in self.NVEC]

    def _observe(self) -> np.ndarray:
        obs = np.zeros(sum(self.NVEC), np.float32)
        obs[self._targets[0]] = 1.0
        obs[self.NVEC[0] + self._targets[1]] = 1.0
        return obs

    def _reward(self, action: Any) -> float:
        return 0.5 * sum(int(a) == t for a, t in zip(np.ravel(action), self._targets, strict=True))


class DictAction(_Episodic):
    """A Dict action of a choice among 3 and two switches, each cued in the observation:
    0.5 reward for the right choice, 0.25 for each switch set right."""

    def __init__(self) -> None:
        super().__init__()
        self.observation_space = spaces.Box(0.0, 1.0, (5,), np.float32)
        self.action_space = spaces.Dict(
            {"choice": spaces.Discrete(3), "switches": spaces.MultiBinary(2)}
        )

    def _draw(self) -> None:
        self._choice = int(self._rng.integers(3))
        self._switches = self._rng.integers(0, 2, 2)

    def _observe(self) -> np.ndarray:
        obs = np.zeros(5, np.float32)
        obs[self._choice] = 1.0
        obs[3:] = self._switches
        return obs

    def _reward(self, action: Any) -> float:
        if not self.action_space.contains(action):
            raise ValueError(f"action {action!r} is not in {self.action_space}")
        right = np.asarray(action["switches"]) == self._switches
        return 0.5 * float(int(action["choice"]) == self._choice) + 0.25 * float(right.sum())


class DictObservation(_Episodic):
    """A dict of an image, a discrete direction and a vector: reward 1 for naming the
    direction (the image and vector are noise the encoders must learn to ignore)."""

    def __init__(self) -> None:
        super().__init__()
        self.observation_space = spaces.Dict(
            {
                "direction": spaces.Discrete(4),
                "image": spaces.Box(0, 255, (1, 6, 6), np.uint8),
                "position": spaces.Box(-1.0, 1.0, (2,), np.float32),
            }
        )
        self.action_space = spaces.Discrete(4)

    def _draw(self) -> None:
        self._direction = int(self._rng.integers(4))

    def _observe(self) -> dict[str, Any]:
        return {
            "direction": self._direction,
            "image": self._rng.integers(0, 256, (1, 6, 6), dtype=np.uint8),
            "position": self._rng.uniform(-1, 1, 2).astype(np.float32),
        }

    def _reward(self, action: Any) -> float:
        return float(int(action) == self._direction)


def masked_choice(**kwargs: Any) -> MaskedChoice:
    return MaskedChoice(**kwargs)


def multi_choice() -> MultiChoice:
    return MultiChoice()


def dict_action() -> DictAction:
    return DictAction()


def dict_observation() -> DictObservation:
    return DictObservation()
