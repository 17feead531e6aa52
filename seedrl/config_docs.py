"""Write ``docs/configuration.md``: every flag of the learner and the actors, from the dataclasses.

The flags are generated from :mod:`seedrl.config`, so their reference page is too: one
table per dataclass (a section per ``# comment`` that groups its fields), each row the
flag, its default and the field's docstring, the same text ``--help`` prints; each
registered agent's knobs are one more table. The agents are the learner's, which this
package may not import, so the page is written by the learner's door: run
``python -m learner.tools.config_docs > docs/configuration.md`` (or ``make docs``) after
changing a field; ``tests/test_config_docs.py`` fails while the committed page is stale.
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from collections.abc import Mapping
from typing import Any

from seedrl.cli import field_docs, field_sections
from seedrl.config import OPTIONS, ActorConfig, AgentOptions, LearnerConfig, agent_sections
from seedrl.conformance.config import ActorSuiteConfig, LearnerSuiteConfig
from seedrl.presets import preset_names

COMMAND = "python -m learner.tools.config_docs > docs/configuration.md"


def flag_of(field: dataclasses.Field[Any], tp: Any) -> str:
    """A field's flag as :func:`seedrl.cli.add_config_arguments` spells it."""
    flag = "--" + field.name.rstrip("_").replace("_", "-")
    if tp is bool:
        return f"`{flag}` / `--no-{flag[2:]}`"
    return f"`{flag} {field.name.rstrip('_').upper()}`"


def default_text(field: dataclasses.Field[Any]) -> str:
    """A field's default as one would type it on the command line."""
    value: Any = field.default
    if value is dataclasses.MISSING and callable(field.default_factory):
        value = field.default_factory()
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return "`" + ",".join(str(v) for v in value) + "`"
    if isinstance(value, dict):
        return "`{}`" if not value else f"`{value}`"
    if value == "":
        return '`""`'
    return f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def flag_table(
    cls: type,
    leading_rows: tuple[str, ...] = (),
    after: Mapping[str, list[str]] | None = None,
    heading: str = "###",
) -> list[str]:
    """Markdown: one ``heading`` section per field group, a flag | default | meaning table
    each; ``leading_rows`` (flags that are not fields) open the first table; ``after``:
    lines that follow the section holding a field (an agent's tables after ``--agent``'s).
    Fields in no group come first: an agent's own knobs before the shared sections its
    options build on (whose fields a dataclass lists first)."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    sections = field_sections(cls)
    lines: list[str] = []
    pending: list[str] = []
    current: str | None = None
    fields = sorted(dataclasses.fields(cls), key=lambda f: sections.get(f.name, "") != "")
    for field in fields:
        if field.metadata.get(OPTIONS):
            continue
        title = sections.get(field.name, "")
        if title != current:
            if current is not None:
                lines += ["", *pending]
                pending = []
            if title:
                lines += [f"{heading} {title[:1].upper()}{title[1:]}", ""]
            lines += ["| flag | default | meaning |", "|---|---|---|"]
            if current is None:
                lines += leading_rows
            current = title
        flag = flag_of(field, hints[field.name])
        doc = _cell(docs.get(field.name, ""))
        lines.append(f"| {flag} | {default_text(field)} | {doc} |")
        pending += [*(after or {}).get(field.name, [])]
    if pending:
        lines += ["", *pending[:-1]] if pending[-1] == "" else ["", *pending]
    return lines


def agent_tables(agents: Mapping[str, type[AgentOptions]]) -> list[str]:
    """Markdown: one ``###`` section per agent, the table of its own knobs."""
    lines: list[str] = []
    for name, options in agents.items():
        lines += [
            f"### Agent: {name} (`--agent {name}`)",
            "",
            _first_line(options),
            "",
            *flag_table(options, heading="####"),
            "",
        ]
    return lines


def _first_line(cls: type) -> str:
    """A config's docstring as one paragraph line."""
    return " ".join((cls.__doc__ or cls.__name__).split())


def render(agents: Mapping[str, type[AgentOptions]] | None = None) -> str:
    """The whole of ``docs/configuration.md``, with the tables of ``agents`` (default: the
    registered ones)."""
    agents = agent_sections() if agents is None else agents
    learner_doc = (LearnerConfig.__doc__ or "").strip().split("\n\n")[0]  # the rest: code
    actor_doc = (ActorConfig.__doc__ or "").strip()
    preset_row = (
        f"| `--preset NAME` | none | a shipped preset: {', '.join(preset_names())} "
        "(`seedrl/presets/NAME.toml`); file and flags override it |"
    )
    config_row = (
        "| `--config FILE` | none | TOML/JSON/YAML file of field values; flags override it |"
    )
    lines = [
        "# Configuration",
        "",
        f"<!-- Generated from the config dataclasses by `{COMMAND}` (or `make docs`).",
        "     Do not edit by hand: tests/test_config_docs.py fails when this page is stale. -->",
        "",
        "Every flag is a field of a frozen dataclass in `seedrl/config.py`, or a knob of an",
        "agent's own section (`learner/agents/NAME/config.py`, one table per agent below: the",
        "flags of the chosen `--agent` only); its help text is the field's docstring, printed",
        "by `python -m learner [--agent NAME] --help` and `python -m actors --help`. Another",
        "agent's knob is refused with status 2. Values come, lowest first, from a shipped preset",
        "(`--preset NAME`, learner only), a config file (`--config FILE`: TOML, JSON, or YAML",
        "with PyYAML), then the flags. Booleans take `--flag` / `--no-flag`; `none` clears an",
        "optional value. A bad value exits with status 2 and one line naming the flag. The",
        "learner saves the resolved config as `LOGDIR/config.json` with every run.",
        "",
        "## Learner: `python -m learner`",
        "",
        f"{learner_doc}",
        "",
        *flag_table(LearnerConfig, (preset_row, config_row), {"agent": agent_tables(agents)}),
        "",
        "## Actors: `python -m actors`",
        "",
        f"{actor_doc}",
        "",
        *flag_table(ActorConfig, (config_row,)),
        "",
        "## Conformance suite: `python -m seedrl.conformance`",
        "",
        "Its settings live in `seedrl/conformance/config.py` ([conformance.md](conformance.md)).",
        "",
        "### Actor side: `python -m seedrl.conformance actor [flags] -- CMD ...`",
        "",
        _first_line(ActorSuiteConfig),
        "",
        *flag_table(ActorSuiteConfig, (config_row,)),
        "",
        "### Learner side: `python -m seedrl.conformance learner HOST:PORT [flags]`",
        "",
        _first_line(LearnerSuiteConfig),
        "",
        *flag_table(LearnerSuiteConfig, (config_row,)),
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    """The page needs the learner's agents, which this package may not import."""
    print(f"the page is written by the learner: {COMMAND}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
