"""PettingZoo, ``pettingzoo.<family>.<env>_v<N>`` (extra ``[pettingzoo]``): multi-agent envs.

The id is the env's module in the PettingZoo package (``pettingzoo.classic.connect_four_v3``);
its ``parallel_env`` is used where the module has one (agents act together), else its
``env`` (an AEC game, played by its turn order). Each agent of each env is a row of the
actor's frame (:mod:`seedrl.envs.agents` has the rules); the agents must share their spaces.
"""

from __future__ import annotations

import importlib
from typing import Any

import gymnasium as gym

from seedrl.envs.agents import AgentEnvs, AgentsEnv
from seedrl.envs.family import EnvError, EnvFamily

PREFIX = "pettingzoo."


def _factory(env_id: str) -> Any:
    """The module's ``parallel_env`` (or ``env``); EnvError for a module PettingZoo lacks."""
    FAMILY.import_requirement(env_id)
    try:
        module = importlib.import_module(env_id)
    except ImportError as exc:
        raise EnvError(f"{env_id}: no such PettingZoo env module ({exc})") from exc
    factory = getattr(module, "parallel_env", None) or getattr(module, "env", None)
    if not callable(factory):
        raise EnvError(f"{env_id}: module has neither parallel_env() nor env()")
    return factory


def make(env_id: str, env_kwargs: dict[str, Any], render_mode: str | None = None) -> gym.Env:
    kwargs = env_kwargs if render_mode is None else {**env_kwargs, "render_mode": render_mode}
    return AgentsEnv(env_id, _factory(env_id)(**kwargs))


def make_vector(env_id: str, env_kwargs: dict[str, Any], num_envs: int) -> gym.vector.VectorEnv:
    factory = _factory(env_id)
    return AgentEnvs(env_id, [lambda: factory(**env_kwargs)] * num_envs)


FAMILY = EnvFamily(
    name="pettingzoo",
    title="PettingZoo",
    ids="`pettingzoo.<family>.<env>_v<N>`",
    example="pettingzoo.classic.connect_four_v3",
    prefix=PREFIX,
    make=make,
    make_vector=make_vector,
    preprocessing=(
        "every agent of every env is a row of the frame: Parallel envs' live agents act "
        "together, AEC games by their turn order (waiting agents are marked not acting)"
    ),
    extra="pettingzoo",
    requires="pettingzoo",
    preset="connect4",
)
