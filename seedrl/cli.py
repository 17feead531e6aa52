"""One command line built from the config dataclasses.

The flags are generated from the dataclasses (``--inference-batch-size`` for
``inference_batch_size``), their help text from the attribute docstrings, so the
dataclass is the single source of truth; ``--preset`` and ``--config FILE`` supply
defaults the flags override (:mod:`seedrl.presets`).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import itertools
import json
import sys
import textwrap
import types
import typing
from collections.abc import Collection, Sequence
from typing import Any, TypeVar

from seedrl.config import AUTH_TOKEN_ENV, REPEATABLE, SECRET_FIELDS, ActorConfig, LearnerConfig
from seedrl.presets import build_config, load_config_file, load_preset, preset_names
from seedrl.security import check_ca_file, config_auth_token

T = TypeVar("T")


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a dataclass (the string literal under each field)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {text!r}")


def text_parser(tp: Any) -> Any:
    """The function a field of type ``tp`` reads its ``--flag``'s text with: a tuple from
    comma-separated items, a boolean from yes/no words, ``none`` for an optional field."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        inner = text_parser(next(a for a in typing.get_args(tp) if a is not type(None)))

        def optional(text: str) -> Any:
            return None if text.lower() in ("none", "") else inner(text)

        return optional
    if origin is tuple:
        (item,) = {a for a in typing.get_args(tp) if a is not Ellipsis}

        def to_tuple(text: str) -> tuple[Any, ...]:
            return tuple(item(p) for p in text.replace(" ", "").split(",") if p)

        return to_tuple
    if origin is dict or tp is dict:

        def to_dict(text: str) -> dict[str, Any]:
            value = json.loads(text)
            if not isinstance(value, dict):
                raise argparse.ArgumentTypeError("expected a JSON object")
            return value

        return to_dict
    if tp is bool:
        return _parse_bool
    return tp


def parse_field(cls: type, name: str, text: str) -> Any:
    """``text`` as field ``name`` of dataclass ``cls``, read as its ``--flag`` reads it, so
    every other way of naming a field's value (``--set FIELD=VALUE``) means the same;
    ValueError in one line when it does not parse."""
    try:
        return text_parser(typing.get_type_hints(cls)[name])(text)
    except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
        raise ValueError(f"{name}={text!r}: {exc}") from exc


class ConfigArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose dataclass-field flags get their docstrings only when help
    is printed: reading them parses the config module's source, a start-up cost in time
    and memory that every one of N actor processes paid and none ever showed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._undocumented: list[tuple[type, argparse.Action]] = []

    def add_field_argument(self, cls: type, group: Any, *args: Any, **kwargs: Any) -> None:
        """``group.add_argument(...)`` for a field of ``cls``; help gets its docstring later."""
        self._undocumented.append((cls, group.add_argument(*args, **kwargs)))

    def format_help(self) -> str:
        for cls, action in self._undocumented:
            # argparse expands %-formats in help; docstrings say "K % G" literally.
            doc = field_docs(cls).get(action.dest, "").replace("%", "%%")
            action.help = f"{doc} {action.help or ''}".strip()
        self._undocumented.clear()
        return super().format_help()


def add_config_arguments(
    parser: ConfigArgumentParser, cls: type, only: Collection[str] | None = None
) -> None:
    """Add one ``--flag`` per dataclass field (booleans get ``--flag/--no-flag``); with
    ``only``, for those fields alone (a command that takes the rest from elsewhere)."""
    hints = typing.get_type_hints(cls)
    group = parser.add_argument_group(cls.__name__)
    for f in dataclasses.fields(cls):
        if only is not None and f.name not in only:
            continue
        flag = "--" + f.name.rstrip("_").replace("_", "-")
        tp = hints[f.name]
        action = "extend" if f.metadata.get(REPEATABLE) else "store"
        default: Any = f.default
        if default is dataclasses.MISSING and callable(f.default_factory):
            default = f.default_factory()
        help_text = f"(default: {default!r})".replace("%", "%%")
        if tp is bool:
            parser.add_field_argument(
                cls,
                group,
                flag,
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_text,
            )
            continue
        metavar = f.name.rstrip("_").upper()
        parser.add_field_argument(
            cls, group, flag, dest=f.name, type=text_parser(tp), default=argparse.SUPPRESS,
            metavar=metavar, help=help_text, action=action,
        )  # fmt: skip


def parse_config(
    cls: type[T],
    argv: Sequence[str] | None,
    prog: str,
    description: str,
    presets: bool = False,
    check_files: bool = False,
) -> T:
    """Parse ``argv`` into ``cls``: ``--preset``, ``--config FILE``, then flags.

    ``check_files``: the process is about to start on this host, so the files its flags
    name must be readable here (a command line checked for another host's files is not)."""
    parser = ConfigArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", help="TOML/JSON/YAML file of field values; flags override")
    if presets:
        parser.add_argument(
            "--preset",
            help=f"a shipped preset ({', '.join(preset_names())}); file and flags override",
        )
    add_config_arguments(parser, cls)
    ns = vars(parser.parse_args(argv))
    for name in sorted(SECRET_FIELDS & ns.keys()):
        if ns[name]:
            flag = "--" + name.replace("_", "-")
            print(
                f"{parser.prog}: warning: {flag} on the command line is visible to every user "
                f"of this host in the process list; prefer {flag}-file PATH or ${AUTH_TOKEN_ENV}",
                file=sys.stderr,
            )
    config_path = ns.pop("config", None)
    preset = ns.pop("preset", None)
    try:
        base = load_preset(preset) if preset else {}
        if config_path:
            base.update(load_config_file(config_path))
        config = build_config(cls, ns, base)
        if isinstance(config, LearnerConfig | ActorConfig):  # an unreadable file: one line now
            config_auth_token(config)
        if check_files and isinstance(config, ActorConfig) and config.tls_ca is not None:
            check_ca_file("--tls-ca", config.tls_ca)
        return config
    except (TypeError, ValueError) as exc:
        # One line, no usage block: the message names the flag, and nothing has started.
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
