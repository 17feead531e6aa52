"""Any registered gymnasium id (``CartPole-v1``, ``Pendulum-v1``, ids of installed plugins).

The env as ``gymnasium.make`` builds it, nothing added; classic control comes with the
base install, other gymnasium families with their own packages.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from seedrl.envs import plugins
from seedrl.envs.family import EnvFamily
from seedrl.envs.vector import NATIVE_VECTOR_MIN_ENVS, ScalarEnvs


def make(env_id: str, env_kwargs: dict[str, Any], render_mode: str | None = None) -> gym.Env:
    kwargs = env_kwargs if render_mode is None else {**env_kwargs, "render_mode": render_mode}
    try:
        return gym.make(env_id, **kwargs)
    except plugins.UNREGISTERED as exc:
        raise _unregistered(env_id, exc) from exc


def _unregistered(env_id: str, exc: gym.error.Error) -> Exception:
    """A plain id no package registered: say how a plugin's id loads. Gymnasium's own
    ``module:EnvId`` form keeps its error (the custom family words that one)."""
    return exc if ":" in env_id else plugins.unregistered_error(env_id, exc)


def make_vector(env_id: str, env_kwargs: dict[str, Any], num_envs: int) -> gym.vector.VectorEnv:
    """gymnasium's native vectorised implementation when the env has one and K is at least
    :data:`NATIVE_VECTOR_MIN_ENVS` (it steps all K in array operations, far cheaper than K
    separate envs at large K), else :class:`ScalarEnvs` (K scalar envs in a plain loop)."""
    try:
        spec = gym.spec(env_id)
    except plugins.UNREGISTERED as exc:
        raise _unregistered(env_id, exc) from exc
    if spec.vector_entry_point is not None and num_envs >= NATIVE_VECTOR_MIN_ENVS:
        return gym.make_vec(
            env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **env_kwargs
        )
    return ScalarEnvs([lambda: gym.make(env_id, **env_kwargs)] * num_envs)


FAMILY = EnvFamily(
    name="gymnasium",
    title="gymnasium",
    ids="any registered id (`CartPole-v1`, `Pendulum-v1`, ...)",
    example="CartPole-v1",
    matches=lambda env_id: True,  # the last family tried: whatever no other family owns
    make=make,
    make_vector=make_vector,
    preprocessing=(
        "none: the env as `gymnasium.make` builds it (classic control is in the base "
        f"install; other ids need their package); from K = {NATIVE_VECTOR_MIN_ENVS} envs an "
        "actor steps the env's native vector env where it has one"
    ),
    preset="cartpole",
)
