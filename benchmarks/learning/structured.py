"""The ``structured`` suite's envs: small tasks with the spaces users bring (dict and tuple
observations mixing an image, discrete leaves and floats; ``MultiDiscrete`` actions whose
reward needs every sub-action right at once; an action mask; a reward only at the end of
a long episode), each with a closed-form random level and a scripted policy that reaches
its upper level.

They import nothing but gymnasium and numpy, so the peers' drivers build them inside
their own virtual environments as seedrl's actors do: by ``module:callable`` id
(``benchmarks.learning.structured:lit_cell``), with the repository on ``PYTHONPATH``.
Every env draws from gymnasium's ``np_random``, so a seeded reset replays an episode.
An action outside the mask (a learner that does not read masks) is a wrong answer, not
an error, so a peer without masking runs the same env.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

GRID = 7
"""Side of the lit-cell image, and the choices of each of its two sub-actions."""
DIRECTIONS = 4
"""The direction leaf's choices: the column answer is the lit column shifted by it."""
NOISE = 3
"""Uniform floats in [-1, 1] that carry nothing (the encoders must learn to ignore them)."""
LIT_STEPS = 10
"""Steps of a lit-cell episode, a fresh cell and direction each step."""
ALLOWED = 3
"""Masked variant: sub-actions each head may pick (the right one and two others)."""
LOCK_NVEC = (3, 4, 5)
LOCK_STEPS = 10
RECALL_STEPS = 30
"""Steps of a register episode: the cue shows at the first, the reward comes at the last."""
KEEP = DIRECTIONS
"""Register env: the action that leaves the register as it is (0..3 write that value)."""
HIDDEN = DIRECTIONS
"""Register env: the cue and register leaves' value for "nothing there"."""


class _Stepped(gym.Env[Any, Any]):
    """An episode of ``steps`` steps, ending terminated; subclasses draw and score."""

    steps = 1

    def __init__(self) -> None:
        # a space of its own per env: a class's spaces would share one sampler's seed
        self.observation_space = copy.deepcopy(type(self).observation_space)
        self.action_space = copy.deepcopy(type(self).action_space)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self._t = 0
        self._start()
        return self._observe(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        reward = self._reward(np.asarray(action))
        self._t += 1
        done = self._t >= self.steps
        if not done:
            self._next()
        return self._observe(), reward, done, False, {}

    def _start(self) -> None:
        self._next()

    def _next(self) -> None:
        raise NotImplementedError

    def _observe(self) -> Any:
        raise NotImplementedError

    def _reward(self, action: np.ndarray) -> float:
        raise NotImplementedError


def _noise(rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(-1.0, 1.0, NOISE).astype(np.float32)


class LitCell(_Stepped):
    """A 7x7 image with one lit cell, a direction d and noise; the action ``[row, column]``
    earns 1 only when the row is the lit cell's and the column is its column plus d
    (mod 7): neither sub-action alone earns anything."""

    steps = LIT_STEPS
    observation_space: spaces.Space[Any] = spaces.Dict(
        {
            "image": spaces.Box(0.0, 1.0, (1, GRID, GRID), np.float32),
            "direction": spaces.Discrete(DIRECTIONS),
            "noise": spaces.Box(-1.0, 1.0, (NOISE,), np.float32),
        }
    )
    action_space = spaces.MultiDiscrete([GRID, GRID])

    def _next(self) -> None:
        rng = self.np_random
        self._row, self._col = (int(x) for x in rng.integers(GRID, size=2))
        self._direction = int(rng.integers(DIRECTIONS))
        self._noise = _noise(rng)

    @property
    def answer(self) -> tuple[int, int]:
        return self._row, (self._col + self._direction) % GRID

    def _leaves(self) -> tuple[np.ndarray, int, np.ndarray]:
        image = np.zeros((1, GRID, GRID), np.float32)
        image[0, self._row, self._col] = 1.0
        return image, self._direction, self._noise.copy()

    def _observe(self) -> Any:
        image, direction, noise = self._leaves()
        return {"image": image, "direction": direction, "noise": noise}

    def _reward(self, action: np.ndarray) -> float:
        return float(tuple(int(a) for a in action) == self.answer)


class LitCellTuple(LitCell):
    """:class:`LitCell` with a tuple observation ``(image, direction, noise)``."""

    observation_space = spaces.Tuple(
        (
            spaces.Box(0.0, 1.0, (1, GRID, GRID), np.float32),
            spaces.Discrete(DIRECTIONS),
            spaces.Box(-1.0, 1.0, (NOISE,), np.float32),
        )
    )

    def _observe(self) -> Any:
        return self._leaves()


class LitCellMasked(LitCell):
    """:class:`LitCell` with an ``action_mask`` leaf (7 + 7 entries) allowing, per
    sub-action, the right choice and two others drawn at random; a masked choice is wrong."""

    observation_space = spaces.Dict(
        {
            **LitCell.observation_space.spaces,  # type: ignore[attr-defined]
            "action_mask": spaces.MultiBinary(2 * GRID),
        }
    )

    def _next(self) -> None:
        super()._next()
        mask = np.zeros((2, GRID), np.int8)
        for head, right in enumerate(self.answer):
            others = np.delete(np.arange(GRID), right)
            mask[head, right] = 1
            mask[head, self.np_random.choice(others, ALLOWED - 1, replace=False)] = 1
        self._mask = mask.reshape(-1)

    def _observe(self) -> Any:
        return {**super()._observe(), "action_mask": self._mask.copy()}


class CombinationLock(_Stepped):
    """A flat vector of the lock's three digits one-hot (3, 4 and 5 choices) and noise;
    the action ``MultiDiscrete([3, 4, 5])`` earns 1 only when all three digits are right."""

    steps = LOCK_STEPS
    observation_space = spaces.Box(-1.0, 1.0, (sum(LOCK_NVEC) + NOISE,), np.float32)
    action_space = spaces.MultiDiscrete(list(LOCK_NVEC))

    def _next(self) -> None:
        self._code = tuple(int(self.np_random.integers(n)) for n in LOCK_NVEC)
        self._noise = _noise(self.np_random)

    def _observe(self) -> np.ndarray:
        obs = np.zeros(sum(LOCK_NVEC) + NOISE, np.float32)
        offsets = np.cumsum((0, *LOCK_NVEC[:-1]))
        obs[offsets + np.array(self._code)] = 1.0
        obs[sum(LOCK_NVEC) :] = self._noise
        return obs

    def _reward(self, action: np.ndarray) -> float:
        return float(tuple(int(a) for a in action) == self._code)


class Register(_Stepped):
    """A cue (one of 4) shows at the first step only; each action writes 0..3 into a
    register the observation shows, or keeps it (4); the episode's one reward, at its
    last step, is 1 when the register then holds the cue. A feed-forward policy can solve
    it (the register carries the cue once written), but only by writing at the first step
    and never overwriting for the 29 after, and the credit comes 30 steps late."""

    steps = RECALL_STEPS
    observation_space = spaces.Dict(
        {
            "cue": spaces.Discrete(DIRECTIONS + 1),
            "register": spaces.Discrete(DIRECTIONS + 1),
            "clock": spaces.Box(0.0, 1.0, (1,), np.float32),
        }
    )
    action_space = spaces.Discrete(DIRECTIONS + 1)

    def _start(self) -> None:
        self._cue = int(self.np_random.integers(DIRECTIONS))
        self._register = HIDDEN

    def _next(self) -> None:
        pass  # nothing new is drawn after the cue

    def _observe(self) -> Any:
        return {
            "cue": self._cue if self._t == 0 else HIDDEN,
            "register": self._register,
            "clock": np.array([self._t / self.steps], np.float32),
        }

    def _reward(self, action: np.ndarray) -> float:
        if int(action) != KEEP:
            self._register = int(action)
        last = self._t == self.steps - 1
        return float(last and self._register == self._cue)


def lit_cell() -> LitCell:
    return LitCell()


def lit_cell_tuple() -> LitCellTuple:
    return LitCellTuple()


def lit_cell_masked() -> LitCellMasked:
    return LitCellMasked()


def combination_lock() -> CombinationLock:
    return CombinationLock()


def register() -> Register:
    return Register()


def lit_cell_action(obs: Any) -> np.ndarray:
    """The lit-cell answer read off the observation (dict or tuple)."""
    image, direction = (obs["image"], obs["direction"]) if isinstance(obs, dict) else obs[:2]
    row, col = np.unravel_index(int(np.argmax(image)), (GRID, GRID))
    return np.array([row, (col + int(direction)) % GRID], np.int64)


def lock_action(obs: np.ndarray) -> np.ndarray:
    """Each digit is the hot entry of its block."""
    blocks = np.split(np.asarray(obs)[: sum(LOCK_NVEC)], np.cumsum(LOCK_NVEC)[:-1])
    return np.array([int(np.argmax(b)) for b in blocks], np.int64)


def register_action(obs: Any) -> int:
    """Write the cue when it shows, else keep."""
    return int(obs["cue"]) if int(obs["cue"]) != HIDDEN else KEEP


@dataclass(frozen=True)
class Levels:
    """What a task's return is measured between."""

    random: float
    """A uniformly random policy's expected episode return (over the allowed actions
    where there is a mask), in closed form."""
    upper: float
    """The best expected return, which the scripted policy reaches."""
    scripted: Callable[[Any], Any]
    """A policy of the observation alone that reaches ``upper``."""


def _masked_random() -> float:
    """Each head picks 1 of its 3 allowed choices, one of them right."""
    return LIT_STEPS / ALLOWED**2


LEVELS: dict[str, Levels] = {
    "lit_cell": Levels(LIT_STEPS / GRID**2, LIT_STEPS, lit_cell_action),
    "lit_cell_tuple": Levels(LIT_STEPS / GRID**2, LIT_STEPS, lit_cell_action),
    "lit_cell_masked": Levels(_masked_random(), LIT_STEPS, lit_cell_action),
    "combination_lock": Levels(LOCK_STEPS / float(np.prod(LOCK_NVEC)), LOCK_STEPS, lock_action),
    # the last write is uniform over the 4 values; with no write at all (1/5 per step)
    # the register stays empty
    "register": Levels(0.25 * (1 - 0.2**RECALL_STEPS), 1.0, register_action),
}
"""Each factory's levels, by its name in this module."""
MODULE = __name__


def env_id(name: str) -> str:
    """The ``module:callable`` id seedrl and the peers build the env ``name`` by."""
    if name not in LEVELS:
        raise ValueError(f"no structured env {name!r}; known: {', '.join(LEVELS)}")
    return f"{MODULE}:{name}"


def levels_of(env: str) -> Levels:
    """The levels of a structured env id."""
    module, _, name = env.partition(":")
    if module != MODULE or name not in LEVELS:
        raise ValueError(f"{env!r} is not a structured env id")
    return LEVELS[name]
