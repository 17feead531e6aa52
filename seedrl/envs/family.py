"""What an env family is: one entry saying how seedrl recognises, builds and scores its envs.

Each family lives in its own module of this package (``atari.py``, ``minatar.py``, ...)
with its preprocessing and one :class:`EnvFamily` value; :mod:`seedrl.envs.registry`
lists them, and everything that depends on the family (actors' vector envs, the
learner's spaces, frame stacking, evaluation, the docs table, the learning benchmark)
asks the entry instead of testing id prefixes.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType, ModuleType
from typing import Any

import gymnasium as gym

EnvMaker = Callable[[str, dict[str, Any], "str | None"], gym.Env]
"""``(env_id, env_kwargs, render_mode) -> env``: one env."""
VectorEnvMaker = Callable[[str, dict[str, Any], int], gym.vector.VectorEnv]
"""``(env_id, env_kwargs, num_envs) -> vector env`` in NEXT_STEP autoreset mode."""


ALLOW_ENV_MODULE_FLAG = "--allow-env-module"
"""The flag with which a host allows a ``module:...`` env named by someone else."""


class EnvError(ValueError):
    """An env id this host cannot build: unknown, not importable, or its extra not installed.

    One line that names the id; entry points turn it into exit status 2.
    """


def _no_overrides() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, eq=False)
class EnvFamily:
    """One env family: the ids it owns, how its envs are built, and its conventions.

    Compared and hashed by identity: the registry holds one value per family."""

    name: str
    """Short name (``atari``): what the docs table and benchmarks call it."""
    title: str
    """What users call it (``Atari (ALE)``), in messages and the docs table."""
    ids: str
    """The ids it owns, as Markdown for the docs table (a code span of ``ALE/<Game>-v5``)."""
    example: str
    """One id of the family that its install can build (docs, tests)."""
    make: EnvMaker
    """One env: the learner's spaces, evaluation, notebooks."""
    make_vector: VectorEnvMaker
    """K envs stepped together in NEXT_STEP autoreset mode: what an actor steps."""
    preprocessing: str
    """What seedrl does to the raw env, in one sentence for the docs table."""
    prefix: str = ""
    """Ids starting with this are the family's; "" for a family that uses ``matches``."""
    matches: Callable[[str], bool] | None = None
    """For a family without a prefix: whether an id is its own."""
    frame_stack: Callable[[str, dict[str, Any]], int] | None = None
    """D when observations stack D frames with seedrl's rule (``seedrl.envs.frame_stack``);
    None for a family whose observations never do."""
    evaluation_kwargs: Mapping[str, Any] = field(default_factory=_no_overrides)
    """Env kwargs that evaluation forces to score as results are published (Atari: a
    whole game, every life), whatever the run trained with."""
    frames_per_step: int = 1
    """Emulator frames per agent step at the family's defaults (Atari's frame skip), to
    compare with published figures quoted in emulator frames."""
    extra: str | None = None
    """The pip extra that installs the family (``seedrl[atari]``); None: the base install."""
    requires: str | None = None
    """The module the extra provides; imported only when an env of the family is built."""
    preset: str | None = None
    """The shipped preset tuned for the family (``--preset``)."""

    def __post_init__(self) -> None:
        if bool(self.prefix) == (self.matches is not None):
            raise ValueError(f"env family {self.name}: give exactly one of prefix and matches")
        if (self.extra is None) != (self.requires is None):
            raise ValueError(
                f"env family {self.name}: give an extra and the module it provides, or neither"
            )
        object.__setattr__(
            self, "evaluation_kwargs", MappingProxyType(dict(self.evaluation_kwargs))
        )

    def owns(self, env_id: str) -> bool:
        """Whether ``env_id`` belongs to this family."""
        if self.matches is not None:
            return self.matches(env_id)
        return env_id.startswith(self.prefix)

    @property
    def install(self) -> str:
        """The command that installs the family (nothing for the base install)."""
        return f"pip install 'seedrl[{self.extra}]'" if self.extra else ""

    def import_requirement(self, env_id: str) -> ModuleType:
        """The family's package, imported; missing, an :class:`EnvError` naming the extra."""
        if self.requires is None:
            raise TypeError(f"env family {self.name} needs no package beyond seedrl's own")
        try:
            return importlib.import_module(self.requires)
        except ImportError as exc:
            raise EnvError(f"{env_id}: {self.title} needs {self.requires}: {self.install}") from exc
