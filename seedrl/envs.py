"""Environment factory shared by the learner (to read spaces) and actors (to step).

An env is named by a registered gymnasium id (``CartPole-v1``) or by a
``module:callable`` factory returning a gymnasium Env, so users plug in their own
environments without editing seedrl. Actors always step a vector env in gymnasium's
NEXT_STEP autoreset mode: an env that ends reports its final observation with the
terminated/truncated flag, and the following step resets it (reward 0, flags clear).
That is exactly the wire contract, so truncated episodes can bootstrap from the value
of their true final observation.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from seedrl import codec
from seedrl.proto import seedrl_pb2 as pb


def _factory(env_id: str) -> Callable[..., gym.Env] | None:
    """The callable behind a ``module:callable`` id, or None for a registered gymnasium id."""
    module_name, sep, attr = env_id.partition(":")
    if not sep or not module_name or not attr.isidentifier():
        return None  # a plain id, or gymnasium's own "module:EnvId-v0" form
    module = importlib.import_module(module_name)
    factory = getattr(module, attr, None)
    if factory is None:
        return None
    if not callable(factory):
        raise ValueError(f"{env_id}: {attr!r} in module {module_name!r} is not callable")
    return factory


def make_env(env_id: str, env_kwargs: dict[str, Any] | None = None) -> gym.Env:
    """One environment instance (learner: spaces and evaluation)."""
    kwargs = dict(env_kwargs or {})
    factory = _factory(env_id)
    if factory is not None:
        return factory(**kwargs)
    return gym.make(env_id, **kwargs)


def make_vector_env(
    env_id: str, env_kwargs: dict[str, Any] | None, num_envs: int
) -> gym.vector.VectorEnv:
    """K environments stepped together in NEXT_STEP autoreset mode.

    Uses gymnasium's native vectorised implementation when the env has one (CartPole's
    is ~15x faster than K separate envs), else a synchronous vector env.
    """
    kwargs = dict(env_kwargs or {})
    factory = _factory(env_id)
    next_step = gym.vector.AutoresetMode.NEXT_STEP
    if factory is not None:
        vec: gym.vector.VectorEnv = gym.vector.SyncVectorEnv(
            [lambda: factory(**kwargs) for _ in range(num_envs)], autoreset_mode=next_step
        )
    else:
        spec = gym.spec(env_id)
        if spec.vector_entry_point is not None:
            vec = gym.make_vec(
                env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **kwargs
            )
        else:
            vec = gym.make_vec(
                env_id,
                num_envs=num_envs,
                vectorization_mode="sync",
                vector_kwargs={"autoreset_mode": next_step},
                **kwargs,
            )
    mode = vec.metadata.get("autoreset_mode")
    if mode is not None and mode != next_step:
        vec.close()
        raise ValueError(f"{env_id}: vector env autoreset mode {mode}, seedrl needs NEXT_STEP")
    return vec


def describe_env(env_id: str, env_kwargs: dict[str, Any] | None = None) -> pb.EnvSpec:
    """Build one env, read its spaces and close it: what the learner publishes in GetInfo."""
    env = make_env(env_id, env_kwargs)
    try:
        return codec.env_spec(
            env_id, dict(env_kwargs or {}), env.observation_space, env.action_space
        )
    finally:
        env.close()
