"""Environment factory shared by the learner (to read spaces) and actors (to step).

An env is named by an id, and the id's family (:mod:`seedrl.envs.registry`: Atari
``ALE/``, MinAtar ``MinAtar/``, your own ``module:callable``, any registered gymnasium
id) builds it, so the learner and every actor build the same preprocessed env from
nothing but the id and kwargs (the learner publishes both in GetInfo). One module per
family holds its maker, preprocessing and conventions; this module only asks the family.
A ``module:...`` id named by someone else (the learner's GetInfo, a checkpoint) is code
to run, so a host builds it only when its own user allowed that module
(:func:`check_env_allowed`, ``--allow-env-module``).

Actors always step a vector env in gymnasium's NEXT_STEP autoreset mode: an env that
ends reports its final observation with the terminated/truncated flag, and the following
step resets it (reward 0, flags clear). That is exactly the wire contract, so truncated
episodes can bootstrap from the value of their true final observation.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from seedrl import codec
from seedrl.envs.custom import (
    ALLOW_ENV_MODULE_FLAG,
    EnvNotAllowed,
    add_allow_env_module_argument,
    check_env_allowed,
    env_allowed,
    env_module,
)
from seedrl.envs.family import EnvError, EnvFamily
from seedrl.envs.registry import FAMILIES, family_named, family_of
from seedrl.envs.vector import NATIVE_VECTOR_MIN_ENVS, ScalarEnvs
from seedrl.proto import seedrl_pb2 as pb

__all__ = [
    "ALLOW_ENV_MODULE_FLAG",
    "FAMILIES",
    "NATIVE_VECTOR_MIN_ENVS",
    "EnvError",
    "EnvFamily",
    "EnvNotAllowed",
    "ScalarEnvs",
    "add_allow_env_module_argument",
    "check_env_allowed",
    "describe_env",
    "env_allowed",
    "env_module",
    "evaluation_kwargs",
    "family_named",
    "family_of",
    "frame_stack",
    "gym",
    "make_env",
    "make_vector_env",
]


def _unknown(env_id: str, exc: gym.error.Error) -> EnvError:
    return EnvError(f"{env_id}: {exc}")


def make_env(
    env_id: str, env_kwargs: dict[str, Any] | None = None, render_mode: str | None = None
) -> gym.Env:
    """One environment instance (learner: spaces and evaluation)."""
    try:
        return family_of(env_id).make(env_id, dict(env_kwargs or {}), render_mode)
    except gym.error.Error as exc:
        raise _unknown(env_id, exc) from exc


def make_vector_env(
    env_id: str, env_kwargs: dict[str, Any] | None, num_envs: int
) -> gym.vector.VectorEnv:
    """K environments stepped together in NEXT_STEP autoreset mode (what an actor steps)."""
    try:
        vec = family_of(env_id).make_vector(env_id, dict(env_kwargs or {}), num_envs)
    except gym.error.Error as exc:
        raise _unknown(env_id, exc) from exc
    mode = vec.metadata.get("autoreset_mode")
    if mode is not None and mode != gym.vector.AutoresetMode.NEXT_STEP:
        vec.close()
        raise EnvError(f"{env_id}: vector env autoreset mode {mode}, seedrl needs NEXT_STEP")
    return vec


def frame_stack(env_id: str, env_kwargs: dict[str, Any] | None) -> int:
    """D when an observation is D frames stacked along its first axis with seedrl's rule,
    else 1.

    The rule: each step shifts the stack by one frame and appends the newest, and an
    episode's first observation is zeros but for its newest frame. Knowing it, actors can
    send only the newest frame and the learner rebuild the rest. Only a family that
    declares it stacks so (:attr:`EnvFamily.frame_stack`: Atari) reports D > 1; envs that
    stack in some other way (a user's own wrapper) report 1 and send whole observations.
    """
    depth = family_of(env_id).frame_stack
    return max(1, depth(env_id, dict(env_kwargs or {}))) if depth else 1


def evaluation_kwargs(env_id: str, env_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """The training kwargs with what the family's evaluation convention forces (Atari:
    an episode is a whole game, whatever ``episodic_life`` the run trained with)."""
    return {**dict(env_kwargs or {}), **family_of(env_id).evaluation_kwargs}


def describe_env(env_id: str, env_kwargs: dict[str, Any] | None = None) -> pb.EnvSpec:
    """Build one env, read its spaces and close it: what the learner publishes in GetInfo."""
    env = make_env(env_id, env_kwargs)
    try:
        return codec.env_spec(
            env_id,
            dict(env_kwargs or {}),
            env.observation_space,
            env.action_space,
            agents=getattr(env, "agent_ids", ()),
        )
    finally:
        env.close()
