"""Where a config's values come from besides flags: shipped presets
(``seedrl/presets/NAME.toml``, ``--preset``) below a config file (TOML, JSON, or YAML when
PyYAML is installed; ``--config``) below the flags: preset < file < flags."""

from __future__ import annotations

import json
import os
import typing
from pathlib import Path
from typing import Any, TypeVar

from seedrl.config import (
    agent_options_class,
    chosen_agent,
    config_hints,
    is_knob_default,
    misplaced_knob,
    options_field,
)

T = TypeVar("T")


def load_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a TOML, JSON or YAML config file into a dict of field values."""
    p = Path(path)
    text = p.read_text()
    if p.suffix == ".toml":
        import tomllib

        data = tomllib.loads(text)
    elif p.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as exc:
            raise ValueError(f"{p}: YAML configs need PyYAML (pip install pyyaml)") from exc
        data = yaml.safe_load(text) or {}
    else:
        data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"{p}: a config file must hold a table/object of fields")
    return {k.replace("-", "_"): v for k, v in data.items()}


def preset_names() -> list[str]:
    """Names of the presets shipped in ``seedrl/presets`` (``cartpole``, ``atari``, ...)."""
    from importlib import resources

    folder = resources.files("seedrl") / "presets"
    return sorted(
        p.name.removesuffix(".toml") for p in folder.iterdir() if p.name.endswith(".toml")
    )


def load_preset(name: str) -> dict[str, Any]:
    """The field values of a shipped preset; unknown names list the known ones."""
    import tomllib
    from importlib import resources

    if name not in preset_names():
        raise ValueError(f"unknown preset {name!r}; shipped presets: {', '.join(preset_names())}")
    text = (resources.files("seedrl") / "presets" / f"{name}.toml").read_text()
    return {k.replace("-", "_"): v for k, v in tomllib.loads(text).items()}


def build_config(cls: type[T], overrides: dict[str, Any], base: dict[str, Any] | None = None) -> T:
    """Make ``cls`` from file values ``base`` then CLI ``overrides``; unknown keys are errors.

    A knob of an agent other than the chosen one is an error naming it and its agent, but
    in ``base`` at that knob's default it is dropped: an old flat ``config.json`` lists
    every agent's knobs."""
    merged = dict(base or {})
    merged.update(overrides)
    sectioned = options_field(cls) is not None
    if sectioned:
        agent_options_class(chosen_agent(merged))  # an unknown --agent first, by name
    hints = config_hints(cls, merged)
    for key in sorted(set(merged) - set(hints)):
        if not sectioned or (message := misplaced_knob(key, chosen_agent(merged))) is None:
            continue
        if key in overrides or not is_knob_default(key, merged[key]):
            raise ValueError(message)
        del merged[key]
    unknown = sorted(set(merged) - set(hints))
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields: {', '.join(unknown)}")
    for key, value in merged.items():
        if typing.get_origin(hints[key]) is tuple and isinstance(value, list):
            merged[key] = tuple(value)
    return cls(**merged)
