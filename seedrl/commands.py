"""The command lines that start seedrl processes, built from their config dataclasses.

``parse_config`` turns flags into a config; :func:`config_flags` is its inverse, so a
process that starts another (the actor launcher's exec mode, the demo, the Python API,
the benchmark) describes it with the same :class:`~seedrl.config.ActorConfig` a user's
flags make, and one function (:func:`actors_command`) spells ``python -m actors``.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from typing import Any

# Secret fields never go on a command line: the token travels in $SEEDRL_AUTH_TOKEN.
from seedrl.config import AUTH_TOKEN_ENV, SECRET_FIELDS, ActorConfig


def config_flags(config: Any) -> list[str]:
    """The flags that make ``parse_config`` rebuild ``config``: one per field that differs
    from its default (booleans as ``--flag``/``--no-flag``), secrets left out."""
    flags: list[str] = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name in SECRET_FIELDS or value is None or value == _default(f):
            continue
        flag = f.name.rstrip("_").replace("_", "-")
        if isinstance(value, bool):
            flags.append(f"--{flag}" if value else f"--no-{flag}")
        elif isinstance(value, tuple | list):
            flags += [f"--{flag}", ",".join(str(v) for v in value)]
        else:
            flags += [f"--{flag}", str(value)]
    return flags


def actors_command(config: ActorConfig, subcommand: str = "") -> list[str]:
    """``python -m actors [subcommand]`` with the flags of ``config`` (``actor`` is one
    actor process, as the launcher's exec mode starts it; none is the launcher)."""
    head = [sys.executable, "-m", "actors", *([subcommand] if subcommand else [])]
    return [*head, *config_flags(config)]


def secret_env(config: Any, environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` plus what :data:`SECRET_FIELDS` keeps off the command line."""
    token = getattr(config, "auth_token", None)
    return {**environ, AUTH_TOKEN_ENV: token} if token else dict(environ)


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING
