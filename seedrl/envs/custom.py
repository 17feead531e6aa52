"""Your own env, ``module:callable``: a factory returning a gymnasium Env, or a PettingZoo
env (AEC or Parallel), whose agents become rows of the frame (:mod:`seedrl.envs.agents`).

Users plug in their environments without editing seedrl. An id of gymnasium's own
``module:EnvId-v0`` form (importing the module registers the id) is built by gymnasium
once the module is imported. :func:`resolve_factory` is the one place where an env id
makes this host import code, and :func:`check_env_allowed` the one rule for when a host
may: a ``module:...`` id named by someone else (the learner's GetInfo, a checkpoint) is
code to run, so a host builds it only when its own user allowed that module
(``--allow-env-module``).
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym

from seedrl.envs import agents, registered
from seedrl.envs.family import ALLOW_ENV_MODULE_FLAG, EnvError, EnvFamily
from seedrl.envs.vector import ScalarEnvs

ENV_ATTRIBUTES = ("reset", "step", "observation_space", "action_space")
"""What an actor uses of a factory's env (a duck-typed env that has them is accepted)."""


class EnvNotAllowed(EnvError):
    """An env id, named by another party, that would import a module this host did not allow."""


def env_module(env_id: str) -> str | None:
    """The module that building ``env_id`` imports by name: the part before the ``:`` of a
    ``module:callable`` factory or of gymnasium's own ``module:EnvId-v0`` form; None for a
    plain id, which only looks up what installed packages registered."""
    module, sep, _ = env_id.partition(":")
    return module if sep else None


def is_module_id(env_id: str) -> bool:
    """``module:...``: an id that names a module to import (this family's ids)."""
    return bool(env_module(env_id))


def env_allowed(env_id: str, allowed: Sequence[str]) -> bool:
    """Whether this host builds ``env_id`` when another party names it.

    Plain ids always; a ``module:...`` id only when an ``allowed`` entry is that exact id,
    or a module that is its module or a package above it (``mypkg`` allows
    ``mypkg.envs:make`` but not ``mypkgevil:make``).
    """
    module = env_module(env_id)
    if module is None:
        return True
    for entry in (e.strip() for e in allowed):
        if ":" in entry:
            if entry == env_id:
                return True
        elif entry and (module == entry or module.startswith(entry + ".")):
            return True
    return False


def add_allow_env_module_argument(parser: argparse.ArgumentParser) -> None:
    """``--allow-env-module MODULE`` (repeatable, into ``allow_env_module``) for a command
    that builds the env a checkpoint names: evaluate and serve ask the same question, in
    the same words."""
    parser.add_argument(
        ALLOW_ENV_MODULE_FLAG, dest="allow_env_module", action="append", default=[],
        metavar="MODULE",
        help="build the checkpoint's module:callable env when it comes from MODULE (or is this "
        "exact id); repeatable. Without it (or --env naming it) such a checkpoint is refused",
    )  # fmt: skip


def check_env_allowed(env_id: str, allowed: Sequence[str], named_by: str) -> None:
    """Raise :class:`EnvNotAllowed` (one line naming the flag) unless :func:`env_allowed`.

    Called before anything is imported: a ``module:callable`` id runs that module's code
    and the callable with the kwargs that come with it, so only the host's own user may
    choose it (``named_by`` says who named it: "the learner", "the checkpoint").
    """
    if env_allowed(env_id, allowed):
        return
    module = env_module(env_id)
    raise EnvNotAllowed(
        f"{named_by} names env {env_id!r}, which would import and run module {module!r} "
        f"on this host: refused; if you trust it, allow it with "
        f"{ALLOW_ENV_MODULE_FLAG} {module or env_id}"
    )


def resolve_factory(env_id: str) -> Callable[..., Any] | None:
    """Import the module an id names; the callable it names, or None when the module is
    to register the id with gymnasium instead (gymnasium's ``module:EnvId-v0`` form)."""
    module_name, _, attr = env_id.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise EnvError(f"{env_id}: cannot import module {module_name!r} ({exc})") from exc
    factory = getattr(module, attr, None) if attr.isidentifier() else None
    if factory is None:
        return None
    if not callable(factory):
        raise EnvError(f"{env_id}: {attr!r} in module {module_name!r} is not callable")
    return factory


def _checked(env_id: str, env: Any) -> gym.Env:
    """The factory's result, refused in one line when it is not an env."""
    missing = [a for a in ENV_ATTRIBUTES if not hasattr(env, a)]
    if missing:
        raise EnvError(
            f"{env_id}: the factory returned {type(env).__name__}, not a gymnasium Env "
            f"(no {', '.join(missing)})"
        )
    return env


def _registered_by_module(env_id: str, build: Callable[[], Any]) -> Any:
    """gymnasium's ``module:EnvId`` form, with a message that names both readings."""
    try:
        return build()
    except gym.error.Error as exc:
        module_name, _, attr = env_id.partition(":")
        raise EnvError(
            f"{env_id}: module {module_name!r} has no callable {attr!r} and registers no "
            f"gymnasium id {attr!r} ({exc})"
        ) from exc


def make(env_id: str, env_kwargs: dict[str, Any], render_mode: str | None = None) -> gym.Env:
    factory = resolve_factory(env_id)
    if factory is None:
        return _registered_by_module(
            env_id, lambda: registered.make(env_id, env_kwargs, render_mode)
        )
    kwargs = env_kwargs if render_mode is None else {**env_kwargs, "render_mode": render_mode}
    env = factory(**kwargs)
    if agents.is_multi_agent(env):  # a PettingZoo env: its agents are rows of the frame
        return agents.AgentsEnv(env_id, env)
    return _checked(env_id, env)


def make_vector(env_id: str, env_kwargs: dict[str, Any], num_envs: int) -> gym.vector.VectorEnv:
    factory = resolve_factory(env_id)
    if factory is None:
        return _registered_by_module(
            env_id, lambda: registered.make_vector(env_id, env_kwargs, num_envs)
        )
    first = factory(**env_kwargs)
    if agents.is_multi_agent(first):
        rest = [lambda: factory(**env_kwargs)] * (num_envs - 1)
        return agents.AgentEnvs(env_id, [lambda: first, *rest])
    rest = [lambda: _checked(env_id, factory(**env_kwargs))] * (num_envs - 1)
    return ScalarEnvs([lambda: _checked(env_id, first), *rest])


FAMILY = EnvFamily(
    name="custom",
    title="your own env",
    ids="`module:callable`",
    example="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
    matches=is_module_id,
    make=make,
    make_vector=make_vector,
    preprocessing=(
        "none: the callable's env with `--env-kwargs` as its keyword arguments; an actor "
        f"host needs the module installed and allowed (`{ALLOW_ENV_MODULE_FLAG} MODULE`)"
    ),
)
