"""What to say when a plain env id is registered nowhere: most often it belongs to a plugin
package that registers its ids when imported (highway-env's ``highway-fast-v0``), which
gymnasium builds from the ``PKG:EnvId`` form once something imports ``PKG``.

The package is found without importing anything: among installed distributions that
depend on gymnasium, the one whose source registers the id by its literal name (a
``register`` call with the id as its first argument). Without one, the hint names the form.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import gymnasium as gym

from seedrl.envs.family import ALLOW_ENV_MODULE_FLAG, EnvError

UNREGISTERED = (gym.error.NameNotFound, gym.error.NamespaceNotFound)
"""gymnasium's errors for an id no imported package registered (not a wrong version)."""
MAX_SOURCE_BYTES = 1 << 20
"""Source files larger than this are not read (generated tables, not registrations)."""
MAX_SOURCE_FILES = 20_000
"""The scan stops after this many files: the hint is for an error, not worth minutes."""


def unregistered_error(env_id: str, exc: gym.error.Error) -> EnvError:
    """gymnasium's error for an unknown plain id, with how to load a plugin's id: one line."""
    what = str(exc).strip()
    found = registering_package(env_id)
    if found is not None:
        hint = (
            f"Package {found} registers it when imported: use --env {found}:{env_id} and "
            f"start the actors with {ALLOW_ENV_MODULE_FLAG} {found}"
        )
    else:
        hint = (
            f"If a package registers it when imported, name the package: --env "
            f"PKG:{env_id}, and start the actors with {ALLOW_ENV_MODULE_FLAG} PKG"
        )
    return EnvError(f"{env_id}: {what} {hint}".replace("\n", " "))


def registering_package(env_id: str) -> str | None:
    """The top-level module of an installed gymnasium plugin whose source registers
    ``env_id`` by its literal name; None when no installed plugin does."""
    quoted = rb"""["']""" + re.escape(env_id.encode()) + rb"""["']"""
    literal = re.compile(rb"register\(\s*(?:id\s*=\s*)?" + quoted)
    budget = MAX_SOURCE_FILES
    for module in _plugin_modules():
        for path in _source_files(module):
            budget -= 1
            if budget < 0:
                return None
            try:
                if path.stat().st_size <= MAX_SOURCE_BYTES and literal.search(path.read_bytes()):
                    return module
            except OSError:
                continue
    return None


def _plugin_modules() -> list[str]:
    """Top-level modules of installed distributions that require gymnasium."""
    plugins = set()
    for dist in metadata.distributions():
        requires = dist.requires or []
        if any(re.match(r"gymnasium\b", r) for r in requires):
            plugins.add(dist.metadata["Name"])
    modules = [
        module
        for module, dists in metadata.packages_distributions().items()
        if plugins.intersection(dists) and module.isidentifier()
    ]
    return sorted(modules)


def _source_files(module: str) -> Iterator[Path]:
    """The ``.py`` files of a top-level module or package, found without importing it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return
    if spec is None:
        return
    if spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            yield from sorted(Path(folder).rglob("*.py"))
    elif spec.origin and spec.origin.endswith(".py"):
        yield Path(spec.origin)
