"""MinAtar, ``MinAtar/<Game>-v0|v1`` (extra ``[minatar]``): MinAtar's gymnasium envs.

The boolean observation is transposed to channels-first ``[C, 10, 10]`` so the CNN never
has to guess the layout (Seaquest's ``10x10x10`` would be ambiguous).
"""

from __future__ import annotations

import logging
from typing import Any

import gymnasium as gym
import numpy as np

from seedrl.envs.family import EnvFamily
from seedrl.envs.vector import ScalarEnvs


def _register(env_id: str) -> None:
    """Register MinAtar's gymnasium ids (its plugin is not auto-loaded by gymnasium 1.x)."""
    if env_id in gym.registry:
        return
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # minatar warns on import when seaborn (rendering) is absent
    try:
        minatar_gym = FAMILY.import_requirement(env_id)
    finally:
        root.setLevel(level)
    minatar_gym.register_envs()


def _channels_first(env: gym.Env) -> gym.Env:
    """MinAtar's ``[10, 10, C]`` observations as ``[C, 10, 10]``."""
    space = env.observation_space
    assert isinstance(space, gym.spaces.Box)
    h, w, c = space.shape
    new_space = gym.spaces.Box(0, 1, shape=(c, h, w), dtype=space.dtype)
    return gym.wrappers.TransformObservation(
        env, lambda obs: np.ascontiguousarray(np.transpose(obs, (2, 0, 1))), new_space
    )


def make(env_id: str, env_kwargs: dict[str, Any], render_mode: str | None = None) -> gym.Env:
    _register(env_id)
    kwargs = env_kwargs if render_mode is None else {**env_kwargs, "render_mode": render_mode}
    return _channels_first(gym.make(env_id, **kwargs))


def make_vector(env_id: str, env_kwargs: dict[str, Any], num_envs: int) -> gym.vector.VectorEnv:
    _register(env_id)
    return ScalarEnvs([lambda: make(env_id, env_kwargs)] * num_envs)


FAMILY = EnvFamily(
    name="minatar",
    title="MinAtar",
    ids="`MinAtar/<Game>-v0|v1`",
    example="MinAtar/Breakout-v1",
    prefix="MinAtar/",
    make=make,
    make_vector=make_vector,
    preprocessing="boolean observations served channels-first, `[C,10,10]`",
    extra="minatar",
    requires="minatar.gym",
    preset="minatar",
)
