"""MuJoCo, gymnasium's ``HalfCheetah-v5``, ``Hopper-v5``, ... (extra ``[mujoco]``).

The env as ``gymnasium.make`` builds it: its ids are registered by gymnasium itself, but
their physics needs the ``mujoco`` package, so this family names the extra that brings
it (a missing package is one line, not a traceback from deep inside gymnasium), and the
preset tuned for continuous control of robots.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from seedrl.envs.family import EnvFamily
from seedrl.envs.vector import ScalarEnvs

ENTRY_POINT_PREFIX = "gymnasium.envs.mujoco."
"""Where gymnasium's MuJoCo envs live: an id whose entry point is there is this family's."""


def owns(env_id: str) -> bool:
    """Whether ``env_id`` is one of gymnasium's MuJoCo envs (read off its registration,
    which gymnasium keeps whether or not mujoco is installed)."""
    spec = gym.registry.get(env_id)
    return (
        spec is not None
        and isinstance(spec.entry_point, str)
        and spec.entry_point.startswith(ENTRY_POINT_PREFIX)
    )


def make(env_id: str, env_kwargs: dict[str, Any], render_mode: str | None = None) -> gym.Env:
    FAMILY.import_requirement(env_id)
    kwargs = env_kwargs if render_mode is None else {**env_kwargs, "render_mode": render_mode}
    return gym.make(env_id, **kwargs)


def make_vector(env_id: str, env_kwargs: dict[str, Any], num_envs: int) -> gym.vector.VectorEnv:
    FAMILY.import_requirement(env_id)
    return ScalarEnvs([lambda: gym.make(env_id, **env_kwargs)] * num_envs)


FAMILY = EnvFamily(
    name="mujoco",
    title="MuJoCo",
    ids="`HalfCheetah-v5`, `Hopper-v5`, `Walker2d-v5`, `Ant-v5`, `Humanoid-v5`, ...",
    example="HalfCheetah-v5",
    matches=owns,
    make=make,
    make_vector=make_vector,
    preprocessing=(
        "none: the env as `gymnasium.make` builds it (the preset normalises observations "
        "and returns in the learner)"
    ),
    extra="mujoco",
    requires="mujoco",
    preset="mujoco",
)
