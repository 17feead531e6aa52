"""PettingZoo, ``pettingzoo.<family>.<env>_v<N>`` (extra ``[pettingzoo]``): multi-agent envs.

The id is the env's module in the PettingZoo package (``pettingzoo.classic.connect_four_v3``,
which PettingZoo's registry calls ``classic/connect_four-v3``); its Parallel API is used
where PettingZoo has one for the env (agents act together), else its AEC API (a game
played by its turn order). Each agent of each env is a row of the
actor's frame (:mod:`seedrl.envs.agents` has the rules); the agents must share their spaces.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from seedrl.envs.agents import AgentEnvs, AgentsEnv
from seedrl.envs.family import EnvError, EnvFamily, EnvMaker, VectorEnvMaker

PREFIX = "pettingzoo."


def registry_id(env_id: str) -> str:
    """The id PettingZoo's own registry knows the env by (``classic/connect_four-v3``)."""
    path, _, version = env_id.removeprefix(PREFIX).rpartition("_v")
    return f"{path.replace('.', '/')}-v{version}"


def env_factory(env_id: str) -> Any:
    """What builds the env: PettingZoo's registry (its Parallel API where registered so,
    else AEC), or on releases before the registry the module's ``parallel_env``/``env``;
    EnvError for an id PettingZoo does not have."""
    pettingzoo = FAMILY.import_requirement(env_id)
    make = getattr(pettingzoo, "make", None)
    if make is not None:
        name = registry_id(env_id)
        for api, registry in (("parallel", "parallel_registry"), ("aec", "aec_registry")):
            if name in getattr(pettingzoo, registry, {}):
                return functools.partial(make, api, name)
    try:
        module = importlib.import_module(env_id)
    except ImportError as exc:
        raise EnvError(f"{env_id}: no such PettingZoo env ({exc})") from exc
    factory = getattr(module, "parallel_env", None) or getattr(module, "env", None)
    if not callable(factory):
        raise EnvError(f"{env_id}: not a PettingZoo env module (no parallel_env() or env())")
    return factory


def agent_env_makers(
    factory_of: Callable[[str], Callable[..., Any]],
) -> tuple[EnvMaker, VectorEnvMaker]:
    """A family's ``make`` and ``make_vector`` from what finds an id's PettingZoo env
    constructor: every family of PettingZoo envs (PettingZoo's own, MPE2) steps its agents
    as rows with the same machinery (:mod:`seedrl.envs.agents`)."""

    def make(env_id: str, env_kwargs: dict[str, Any], render_mode: str | None = None) -> gym.Env:
        kwargs = env_kwargs if render_mode is None else {**env_kwargs, "render_mode": render_mode}
        return AgentsEnv(env_id, factory_of(env_id)(**kwargs))

    def make_vector(env_id: str, env_kwargs: dict[str, Any], num_envs: int) -> gym.vector.VectorEnv:
        factory = factory_of(env_id)
        return AgentEnvs(env_id, [lambda: factory(**env_kwargs)] * num_envs)

    for maker in (make, make_vector):  # they belong to the family whose factory they wrap
        maker.__module__ = factory_of.__module__
    return make, make_vector


make, make_vector = agent_env_makers(env_factory)


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
