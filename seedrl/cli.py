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
import re
import sys
import textwrap
import types
import typing
from collections.abc import Collection, Sequence
from typing import Any, TypeVar

from seedrl.config import (
    AUTH_TOKEN_ENV,
    OPTIONS,
    REPEATABLE,
    SECRET_FIELDS,
    ActorConfig,
    LearnerConfig,
    agent_options_class,
    agent_sections,
    chosen_agent,
    config_hints,
    knob_names,
    knob_type,
    misplaced_knob,
    options_field,
)
from seedrl.presets import build_config, load_config_file, load_preset, preset_names
from seedrl.security import check_ca_file, config_auth_token

T = TypeVar("T")


def _dataclass_line(cls: type) -> list[type]:
    """``cls`` and the dataclasses it builds on, the deepest base first."""
    return [k for k in reversed(cls.__mro__) if dataclasses.is_dataclass(k)]


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a dataclass (the string literal under each field), its
    bases' too: a knob a shared section declares keeps its docstring in every agent whose
    options build on it, unless the agent gives the knob a new one."""
    docs: dict[str, str] = {}
    for klass in _dataclass_line(cls):
        docs.update(_own_field_docs(klass))
    return docs


def _own_field_docs(cls: type) -> dict[str, str]:
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


_SECTION = re.compile(r"^\s+#\s*(?P<title>.+?)\s*$")
_FIELD = re.compile(r"^\s+(?P<name>[a-z_][a-z0-9_]*)\s*:")
FOREIGN = "foreign knob:"
"""Parser dest prefix of another agent's knob: refused by name once the flags are read."""


@functools.cache
def field_sections(cls: type) -> dict[str, str]:
    """Field name -> the title of the ``# comment`` above it in the class body ("" before
    any), in the body of the class that first declares it: a subclass that redeclares a
    base's field, to change its default, leaves it in the base's section."""
    sections: dict[str, str] = {}
    for klass in _dataclass_line(cls):
        names = set(inspect.get_annotations(klass))
        title = ""
        for line in inspect.getsource(klass).splitlines():
            if match := _SECTION.match(line):
                title = match["title"]
            elif (match := _FIELD.match(line)) and match["name"] in names:
                sections.setdefault(match["name"], title)
    return sections


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
    tp = config_hints(cls, {}).get(name)
    if tp is None and options_field(cls) is not None:
        tp = knob_type(name)  # a knob of an agent other than the default one
    if tp is None:
        raise ValueError(f"{name}={text!r}: not a {cls.__name__} field")
    try:
        return text_parser(tp)(text)
    except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
        raise ValueError(f"{name}={text!r}: {exc}") from exc


class ConfigArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose dataclass-field flags get their docstrings only when help
    is printed: reading them parses the config module's source, a start-up cost in time
    and memory that every one of N actor processes paid and none ever showed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._undocumented: list[tuple[type, Any, argparse.Action]] = []
        self._placed: list[tuple[Any, str]] = []

    def place_group_after(self, group: Any, dest: str) -> None:
        """Show ``group`` in ``--help`` right after the group of flag ``dest`` (an agent's
        knobs after ``--agent``'s section)."""
        self._placed.append((group, dest))

    def add_field_argument(self, cls: type, group: Any, *args: Any, **kwargs: Any) -> None:
        """``group.add_argument(...)`` for a field of ``cls``; help gets its docstring later."""
        self._undocumented.append((cls, group, group.add_argument(*args, **kwargs)))

    def format_help(self) -> str:
        sections: dict[str, Any] = {}
        follows: dict[int, list[Any]] = {}  # placed group's id -> sections split off it
        placed = {id(group) for group, _ in self._placed}
        for cls, group, action in self._undocumented:
            # argparse expands %-formats in help; docstrings say "K % G" literally.
            doc = field_docs(cls).get(action.dest, "").replace("%", "%%")
            action.help = f"{doc} {action.help or ''}".strip()
            if title := field_sections(cls).get(action.dest, ""):
                # Grouped by the class's ``# section`` comments only now: reading them
                # parses the module's source, which parsing flags never needs.
                if title not in sections:
                    sections[title] = self.add_argument_group(title)
                    if id(group) in placed:  # an agent's shared section (its replay's)
                        follows.setdefault(id(group), []).append(sections[title])
                group._group_actions.remove(action)
                sections[title]._group_actions.append(action)
        self._undocumented.clear()
        groups = [g for g in self._action_groups if g._group_actions]
        for group, dest in self._placed:
            holder = next(
                (g for g in groups if any(a.dest == dest for a in g._group_actions)), None
            )
            moving = [g for g in (group, *follows.get(id(group), ())) if g in groups]
            if holder is not None and holder not in moving:
                for g in moving:
                    groups.remove(g)
                at = groups.index(holder) + 1
                groups[at:at] = moving
        self._action_groups = groups
        return super().format_help()


def add_config_arguments(
    parser: ConfigArgumentParser,
    cls: type,
    only: Collection[str] | None = None,
    agent: str | None = None,
) -> None:
    """Add one ``--flag`` per dataclass field (booleans get ``--flag/--no-flag``); with
    ``only``, for those fields alone (a command that takes the rest from elsewhere).

    A config with a section of agent knobs (the learner's) gets the knobs of ``agent``
    (default: the default agent) in a group of their own, and every other agent's knobs
    as hidden flags that :func:`parse_config` refuses by name."""
    hints = typing.get_type_hints(cls)
    group = parser.add_argument_group(cls.__name__)
    for f in dataclasses.fields(cls):
        if (only is None or f.name in only) and not f.metadata.get(OPTIONS):
            _add_field(parser, cls, group, f, hints[f.name])
    if options_field(cls) is None or only is not None:
        return
    agent = agent or chosen_agent({})
    options = agent_options_class(agent)
    group = parser.add_argument_group(
        f"agent: {agent} (--agent {agent})", " ".join((options.__doc__ or "").split())
    )
    parser.place_group_after(group, "agent")
    option_hints = typing.get_type_hints(options)
    for f in dataclasses.fields(options):
        _add_field(parser, options, group, f, option_hints[f.name])
    taken = set(hints) | knob_names(options)
    for other in agent_sections().values():
        other_hints = typing.get_type_hints(other)
        for f in dataclasses.fields(other):
            if f.name not in taken:
                taken.add(f.name)
                _add_field(parser, other, parser, f, other_hints[f.name], hidden=True)


def _add_field(
    parser: ConfigArgumentParser,
    cls: type,
    group: Any,
    f: dataclasses.Field[Any],
    tp: Any,
    hidden: bool = False,
) -> None:
    """One field's ``--flag`` in ``group``; ``hidden``: another agent's knob, kept out of
    ``--help`` and parsed into a ``FOREIGN`` dest that is refused by name."""
    flag = "--" + f.name.rstrip("_").replace("_", "-")
    default: Any = f.default
    if default is dataclasses.MISSING and callable(f.default_factory):
        default = f.default_factory()
    help_text = argparse.SUPPRESS if hidden else f"(default: {default!r})".replace("%", "%%")
    dest = FOREIGN + f.name if hidden else f.name
    add = group.add_argument if hidden else functools.partial(parser.add_field_argument, cls, group)
    if tp is bool:
        add(
            flag, dest=dest, action=argparse.BooleanOptionalAction,
            default=argparse.SUPPRESS, help=help_text,
        )  # fmt: skip
        return
    action = "extend" if f.metadata.get(REPEATABLE) else "store"
    add(
        flag, dest=dest, type=text_parser(tp), default=argparse.SUPPRESS,
        metavar=f.name.rstrip("_").upper(), help=help_text, action=action,
    )  # fmt: skip


def _agent_of(argv: Sequence[str] | None, presets: bool) -> str:
    """The ``--agent`` a command line chooses, by the flag, else its ``--config`` file,
    else its ``--preset``: the learner's parser offers that agent's knobs. A file that
    does not read is left to the real parse, which says so."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--agent")
    early.add_argument("--config")
    if presets:
        early.add_argument("--preset")
    known, _ = early.parse_known_args(argv)
    if known.agent:
        return str(known.agent)
    values: dict[str, Any] = {}
    try:
        if getattr(known, "preset", None):
            values.update(load_preset(known.preset))
        if known.config:
            values.update(load_config_file(known.config))
    except (OSError, ValueError):
        pass
    return chosen_agent(values)


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
    agent = None
    if options_field(cls) is not None:
        agent = _agent_of(argv, presets)
        try:
            agent_options_class(agent)
        except ValueError as exc:  # the knobs offered depend on it
            parser.exit(2, f"{parser.prog}: error: {exc}\n")
    add_config_arguments(parser, cls, agent=agent)
    ns = vars(parser.parse_args(argv))
    for name in sorted(k for k in ns if k.startswith(FOREIGN)):
        parser.exit(
            2, f"{parser.prog}: error: {misplaced_knob(name[len(FOREIGN) :], agent or '')}\n"
        )
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
