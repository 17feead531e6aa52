"""Where a config's values come from besides flags: shipped presets
(``seedrl/presets/NAME.toml``, ``--preset``) below a config file (TOML, JSON, or YAML when
PyYAML is installed; ``--config``) below the flags: preset < file < flags."""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from pathlib import Path
from typing import Any, TypeVar

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
    """Make ``cls`` from file values ``base`` then CLI ``overrides``; unknown keys are errors."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    merged = dict(base or {})
    merged.update(overrides)
    unknown = sorted(set(merged) - names)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields: {', '.join(unknown)}")
    hints = typing.get_type_hints(cls)
    for key, value in merged.items():
        if typing.get_origin(hints[key]) is tuple and isinstance(value, list):
            merged[key] = tuple(value)
    return cls(**merged)
