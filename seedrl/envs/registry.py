"""The env families seedrl knows, in the order an id is matched against them.

Adding a family: a module beside this one with its preprocessing and an
:class:`~seedrl.envs.family.EnvFamily` value, listed here before the catch-all
``registered.FAMILY``; then ``make docs`` (docs/usage.md's table is generated from this
list, and tests/test_env_registry.py checks the extra and preset it names).
"""

from __future__ import annotations

from seedrl.envs import atari, custom, minatar, minigrid, mpe, mujoco, pettingzoo, registered
from seedrl.envs.family import EnvFamily

FAMILIES: tuple[EnvFamily, ...] = (
    atari.FAMILY,
    minatar.FAMILY,
    pettingzoo.FAMILY,
    mpe.FAMILY,
    minigrid.FAMILY,
    mujoco.FAMILY,
    custom.FAMILY,
    registered.FAMILY,  # owns every id: keep it last
)


def family_of(env_id: str) -> EnvFamily:
    """The family that owns ``env_id``: the first in :data:`FAMILIES` that claims it."""
    return next(family for family in FAMILIES if family.owns(env_id))


def family_named(name: str) -> EnvFamily:
    """The family called ``name`` (``atari``); unknown names list the known ones."""
    for family in FAMILIES:
        if family.name == name:
            return family
    raise ValueError(f"unknown env family {name!r}; known: {', '.join(f.name for f in FAMILIES)}")
