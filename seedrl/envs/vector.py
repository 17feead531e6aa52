"""K scalar envs as one vector env, and when a native vector env is worth it instead."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

from seedrl import codec

NATIVE_VECTOR_MIN_ENVS = 6
"""Below this K, K scalar envs (:class:`ScalarEnvs`) step faster than a native vector env.

A native vector env pays a fixed cost per step in numpy calls on tiny arrays (and an
action-space check) whatever K is; K scalar envs pay per env, so the two costs cross at
a small K (for CartPole, between 4 and 8 envs; docs/performance.md).
"""


class ScalarEnvs(gym.vector.VectorEnv):
    """K scalar envs stepped in a plain loop into preallocated arrays, NEXT_STEP autoreset.

    What gymnasium's SyncVectorEnv computes (same seeds, same numbers), minus the
    generality an actor never uses: a deep copy of the observations, space-dispatched
    concatenation, fresh copies of the reward and flag arrays and merged info dicts on
    every step, which for a cheap env like CartPole is most of a step's cost. The
    arrays returned are reused by the next step; infos are always empty.
    """

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]]) -> None:
        self.envs = [make() for make in env_fns]
        first = self.envs[0]
        space = first.observation_space
        try:
            spec = codec.space_to_spec(space)
        except ValueError:
            self.close_extras()
            raise
        self.num_envs = len(self.envs)
        self.single_observation_space = space
        self.single_action_space = first.action_space
        self.observation_space = gym.vector.utils.batch_space(space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(first.action_space, self.num_envs)
        self.metadata = {**first.metadata, "autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}
        self.spec = first.spec
        self.render_mode = first.render_mode
        # One array per leaf; a dict/tuple space's observations are views of them.
        self._leaves_K = [
            np.zeros((self.num_envs, *leaf.shape), leaf.dtype) for leaf in codec.space_leaves(spec)
        ]
        self._spec = spec
        self._structured = codec.is_structured(spec)
        self._observations = codec.unflatten_values(spec, self._leaves_K)
        self._rewards = np.zeros(self.num_envs, np.float64)
        self._terminated = np.zeros(self.num_envs, np.bool_)
        self._truncated = np.zeros(self.num_envs, np.bool_)
        self._autoreset = [False] * self.num_envs

    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every env; an int seed seeds env i with seed + i, as SyncVectorEnv does."""
        if seed is None or isinstance(seed, int):
            seeds = [None if seed is None else seed + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
        for i, (env, env_seed) in enumerate(zip(self.envs, seeds, strict=True)):
            self._put(i, env.reset(seed=env_seed, options=options)[0])
        self._autoreset = [False] * self.num_envs
        self._rewards[:] = 0.0
        self._terminated[:] = False
        self._truncated[:] = False
        return self._observations, {}

    def step(
        self, actions: Any
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """One step of every env; an env that ended on the previous step resets instead."""
        if self._structured or isinstance(actions, dict | tuple):
            return self._step_structured(actions)
        obs_KO, autoreset = self._observations, self._autoreset
        reward: SupportsFloat
        for i, env in enumerate(self.envs):
            if autoreset[i]:
                obs_KO[i], _ = env.reset()
                reward, terminated, truncated = 0.0, False, False
            else:
                obs_KO[i], reward, terminated, truncated, _ = env.step(actions[i])
            self._rewards[i] = reward
            self._terminated[i] = terminated
            self._truncated[i] = truncated
            autoreset[i] = terminated or truncated
        return obs_KO, self._rewards, self._terminated, self._truncated, {}

    def _step_structured(
        self, actions: Any
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """``step`` for dict/tuple observations or actions: values go leaf by leaf."""
        autoreset = self._autoreset
        reward: SupportsFloat
        for i, env in enumerate(self.envs):
            if autoreset[i]:
                obs, _ = env.reset()
                reward, terminated, truncated = 0.0, False, False
            else:
                obs, reward, terminated, truncated, _ = env.step(_action_of(actions, i))
            self._put(i, obs)
            self._rewards[i] = reward
            self._terminated[i] = terminated
            self._truncated[i] = truncated
            autoreset[i] = terminated or truncated
        return self._observations, self._rewards, self._terminated, self._truncated, {}

    def _put(self, i: int, obs: Any) -> None:
        """Write env i's observation into each leaf's array."""
        for leaf_K, value in zip(
            self._leaves_K, codec.flatten_values(self._spec, obs), strict=True
        ):
            leaf_K[i] = value

    def render(self) -> tuple[Any, ...] | None:
        return tuple(env.render() for env in self.envs)

    def close_extras(self, **kwargs: Any) -> None:
        for env in self.envs:
            env.close()


def _action_of(actions: Any, i: int) -> Any:
    """Env i's action out of a batch of structured actions (dicts and tuples of arrays)."""
    if isinstance(actions, dict):
        return {key: _action_of(value, i) for key, value in actions.items()}
    if isinstance(actions, tuple):
        return tuple(_action_of(value, i) for value in actions)
    return actions[i]
