"""MPE2, ``mpe2.<env>_v<N>`` (extra ``[mpe]``): the multi-agent particle envs.

PettingZoo 1.27 moved MPE (``simple_spread``, ``simple_tag``, ...) into its own package,
MPE2; the id is the env's module there (``mpe2.simple_spread_v3``) and its Parallel API
is used (every live agent acts every step), with the PettingZoo family's machinery: each
agent of each env is a row of the actor's frame (:mod:`seedrl.envs.agents`), and the
agents must share their spaces (one policy serves them all).
"""

from __future__ import annotations

import importlib
import re
from typing import Any

from seedrl.envs.family import EnvError, EnvFamily
from seedrl.envs.pettingzoo import agent_env_makers

PREFIX = "mpe2."
MODULE = re.compile(r"^mpe2\.\w+_v\d+$")
"""An env's module in the MPE2 package: the only ids the family builds."""


def env_factory(env_id: str) -> Any:
    """The env module's ``parallel_env``; EnvError for an id MPE2 does not have."""
    FAMILY.import_requirement(env_id)
    if not MODULE.match(env_id):
        raise EnvError(f"{env_id}: not an MPE2 env id (mpe2.<env>_v<N>, e.g. {FAMILY.example})")
    try:
        module = importlib.import_module(env_id)
    except ImportError as exc:
        raise EnvError(f"{env_id}: no such MPE2 env ({exc})") from exc
    factory = getattr(module, "parallel_env", None)
    if not callable(factory):
        raise EnvError(f"{env_id}: not an MPE2 env module (no parallel_env())")
    return factory


make, make_vector = agent_env_makers(env_factory)

FAMILY = EnvFamily(
    name="mpe",
    title="MPE2",
    ids="`mpe2.<env>_v<N>`",
    example="mpe2.simple_spread_v3",
    prefix=PREFIX,
    make=make,
    make_vector=make_vector,
    preprocessing=(
        "every agent of every env is a row of the frame, all live agents acting together "
        "(PettingZoo's Parallel API), one policy shared by all"
    ),
    extra="mpe",
    requires="mpe2",
    preset="spread",
)
