"""The README stays a short map whose links and named paths exist; docs/ has its pages;
every repository path and code name the docs use exists, so they cannot go stale silently."""

from __future__ import annotations

import ast
import builtins
import dataclasses
import functools
import glob
import importlib
import inspect
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = (
    "architecture.md",
    "wire-protocol.md",
    "conformance.md",
    "actors-in-other-languages.md",
    "configuration.md",
    "usage.md",
    "deployment.md",
    "reliability.md",
    "performance.md",
    "logs/performance-log.md",
    "logs/learning-log.md",
)
DOCS = (README, *sorted((ROOT / "docs").rglob("*.md")))
"""The README and every page under docs/, the dated logs in docs/logs/ among them."""
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def test_readme_is_short() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move depth to docs/"


def test_readme_links_every_docs_page() -> None:
    text = README.read_text()
    for page in PAGES:
        assert (ROOT / "docs" / page).is_file(), f"docs/{page} is missing"
        assert f"(docs/{page}" in text, f"README.md does not link docs/{page}"


def test_relative_links_resolve() -> None:
    for doc in DOCS:
        for target in LINK.findall(doc.read_text()):
            if "://" in target:
                continue
            assert (doc.parent / target).exists(), f"{doc.relative_to(ROOT)} links {target}"


FIRST_SCREEN = 40
"""Lines of the README a newcomer sees first: what it is, the two commands, the map."""
FLAG_MEANING_CHARS = 100
"""A README flag row says what the flag is for in one short line; configuration.md says
the rest."""
ANCHOR_LINK = re.compile(r"\]\(([^)\s]*)#([^)\s]+)\)")


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_readme_first_screen_is_what_it_is_the_two_commands_and_the_map() -> None:
    screen = "\n".join(README.read_text().splitlines()[:FIRST_SCREEN])
    for needed in ("make demo", "make test", "docs/architecture.md#where-to-change-things"):
        assert needed in screen, f"README.md's first {FIRST_SCREEN} lines lack {needed!r}"
    map_rows = [line for line in screen.splitlines() if line.startswith("| ") and "`" in line]
    assert len(map_rows) >= 8, "README.md's first screen has no map of where things live"


def test_the_readme_anchors_name_headings_that_exist() -> None:
    """The links test checks files; this checks the ``#section`` of each README link, so
    a renamed heading does not leave the README pointing at the top of a page."""
    for target, anchor in ANCHOR_LINK.findall(README.read_text()):
        page = ROOT / target if target else README
        headings = {
            _slug(line.lstrip("#"))
            for line in page.read_text().splitlines()
            if re.match(r"#{1,6} ", line)
        }
        assert anchor in headings, f"README.md links {target}#{anchor}, no such heading"


def test_the_readme_flag_tables_are_one_short_line_per_flag_that_exists() -> None:
    import learner  # noqa: F401  (registers the agents' sections)
    from seedrl.config import ActorConfig, LearnerConfig, agent_sections

    knobs = {f.name for options in agent_sections().values() for f in dataclasses.fields(options)}
    tables = _section(README.read_text(), "Main flags").split("\n\n")
    checked = 0
    for table in tables:
        rows = table.splitlines()
        if not rows or not rows[0].startswith("| ") or " flag |" not in rows[0]:
            continue
        cls = ActorConfig if rows[0].startswith("| actor") else LearnerConfig
        names = {f.name for f in dataclasses.fields(cls)} | {"config", "preset"}
        if cls is LearnerConfig:
            names |= knobs
        for row in rows[2:]:
            flags_cell, _default, meaning = row.strip("|").split(" | ")
            for flag in re.findall(r"`--([a-z0-9-]+)`", flags_cell):
                assert flag.replace("-", "_") in names, f"README.md names --{flag}: no such flag"
                checked += 1
            assert len(meaning.strip()) <= FLAG_MEANING_CHARS, (
                f"README.md's row for {flags_cell.strip()} runs to {len(meaning.strip())} "
                f"characters; the long explanation belongs in docs/configuration.md"
            )
    assert checked > 20


def test_the_repository_map_names_paths_that_exist() -> None:
    table = _section(README.read_text(), "Repository contents")
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert len(rows) > 10
    for row in rows:
        first_cell = row.split(" | ")[0]
        for path in re.findall(r"`([^`]+)`", first_cell):
            assert (ROOT / path).exists(), f"README's map names {path}, which does not exist"


# ------------------------------------------------ names in the docs that must exist

PROJECT_PACKAGES = ("seedrl", "learner", "actors", "benchmarks")
TOP_DIRS = ("actors", "benchmarks", "deploy", "docs", "learner", "protos", "seedrl", "tests", ".ci")
FILE_SUFFIXES = {
    "md", "py", "pyi", "toml", "json", "jsonl", "yml", "yaml", "txt", "csv", "png", "gif",
    "mp4", "pt", "sh", "proto", "env", "example", "log", "whl", "tar", "gz", "pem", "key",
    "so", "cfg", "ini", "html", "sock",
}  # fmt: skip
EXTERNAL_NAMES = {
    # library names the docs mention bare that no source file here spells out
    "PyObject_GetAttr", "TorchDispatchMode",
    # a /proc/PID/smaps field
    "Referenced",
}  # fmt: skip
HOST_SUFFIXES = {"local", "svc", "com", "org", "net", "io", "internal"}
"""A dotted name ending so is a host name (``learner.seedrl.svc``), not code."""
FENCE = re.compile(r"^\s*(```|~~~)\s*([\w+-]*)")
PATH = re.compile(
    r"(?<![\w/.~$:-])((?:" + "|".join(re.escape(d) for d in TOP_DIRS) + r")/[\w./*{},<>-]*)"
)
DOTTED = re.compile(r"(?<![\w./:-])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?![\w/-])")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
BARE_CLASS = re.compile(r"^[A-Z][a-z]\w*[A-Z]\w*$|^[A-Z][a-z]+$")
URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+")


def _chunks(text: str) -> Iterator[tuple[str, str]]:
    """(language, text) of each fenced block ('' for none) and ('prose', text) between them."""
    lines, lang = [], "prose"
    for line in text.splitlines():
        match = FENCE.match(line)
        if match is None:
            lines.append(line)
            continue
        yield lang, "\n".join(lines)
        lines, lang = [], (match.group(2) if lang == "prose" else "prose")
    yield lang, "\n".join(lines)


def _named(pattern: re.Pattern[str]) -> Iterator[tuple[str, str]]:
    """(doc, name) for every match of ``pattern`` in the docs, URLs left out."""
    for doc in DOCS:
        for _lang, text in _chunks(doc.read_text()):
            for match in pattern.finditer(URL.sub(" ", text)):
                yield str(doc.relative_to(ROOT)), match.group(1)


def _path_patterns(path: str) -> list[str]:
    """Glob patterns for a path as written: ``{a,b}`` expanded, placeholders (``NAME``,
    ``SUITE``, ``seedN``, ``<pid>``) matching anything."""
    path = path.rstrip(".,;:")
    brace = re.search(r"\{([^{}]*)\}", path)
    if brace:
        return [
            p
            for option in brace.group(1).split(",")
            for p in _path_patterns(path[: brace.start()] + option + path[brace.end() :])
        ]
    return [re.sub(r"[A-Z]+(?![a-z])|<[^>]*>", "*", path)]


def _ignored_by_git(path: str) -> bool:
    """A path the repository ignores: something a command makes (``deploy/seedrl.env``,
    or a folder such as ``deploy/tls/``, which git matches only with its slash)."""
    for candidate in {path, path.rstrip("/") + "/"}:
        done = subprocess.run(
            ["git", "check-ignore", "-q", candidate], cwd=ROOT, capture_output=True, check=False
        )
        if done.returncode == 0:
            return True
    return False


@functools.cache
def _code_words() -> frozenset[str]:
    """Every identifier in the repository's tracked files other than its docs and this
    test: Python, the C++ actor, the proto, the Makefile, the deploy files."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    words: set[str] = set()
    for name in listed.split("\0"):
        path = ROOT / name
        if name.endswith(".md") or path == Path(__file__) or not path.is_file():
            continue
        if path.stat().st_size > 2**20:
            continue
        try:
            words.update(re.findall(r"[A-Za-z_]\w*", path.read_text()))
        except UnicodeDecodeError:  # an image
            continue
    return frozenset(words)


@functools.cache
def _project_classes() -> dict[str, list[str]]:
    """Class name -> the project modules defining it at top level (read, not imported)."""
    found: dict[str, list[str]] = {}
    for package in PROJECT_PACKAGES:
        for source in sorted((ROOT / package).rglob("*.py")):
            if "_pb2" in source.name:
                continue
            module = ".".join(source.relative_to(ROOT).with_suffix("").parts)
            module = module.removesuffix(".__init__")
            for node in ast.parse(source.read_text()).body:
                if isinstance(node, ast.ClassDef):
                    found.setdefault(node.name, []).append(module)
    return found


@functools.cache
def _proto_names() -> dict[str, set[str]]:
    """Each message and service of the wire contract -> its fields or methods."""
    from seedrl.proto import seedrl_pb2

    messages = seedrl_pb2.DESCRIPTOR.message_types_by_name.values()
    names = {m.name: set(m.fields_by_name) for m in messages}
    for service in seedrl_pb2.DESCRIPTOR.services_by_name.values():
        names[service.name] = set(service.methods_by_name)
    return names


def _has_attribute(owner: Any, attr: str) -> bool:
    """``owner.attr`` exists, counting instance attributes a class declares (annotations,
    dataclass fields) or assigns in its methods (``self.attr = ...``)."""
    if hasattr(owner, attr):
        return True
    if not inspect.isclass(owner):
        return False
    for cls in owner.__mro__:
        if attr in getattr(cls, "__annotations__", {}):
            return True
        try:
            source = inspect.getsource(cls)
        except (OSError, TypeError):
            continue
        if re.search(rf"\bself\.{re.escape(attr)}\s*(?::[^=\n]+)?=[^=]", source):
            return True
    return False


def _resolve(owner: Any, chain: list[str]) -> bool:
    for attr in chain:
        if not _has_attribute(owner, attr):
            return False
        owner = getattr(owner, attr, None)
    return True


def _resolve_module_path(name: str) -> bool:
    """``package.module.Symbol.attr``: import the longest module prefix, getattr the rest."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        return _resolve(module, parts[cut:])
    return False


def _resolve_class_path(name: str) -> bool:
    """``Class.attr``: some project class (or wire message/service) of that name has it."""
    head, *chain = name.split(".")
    for module in _project_classes().get(head, []):
        if _resolve(getattr(importlib.import_module(module), head), chain):
            return True
    proto = _proto_names()
    return head in proto and len(chain) == 1 and chain[0] in proto[head]


def _dotted_name_problem(name: str) -> str | None:
    """Why a dotted name the docs use does not exist (None: it does, or is not ours)."""
    parts = name.split(".")
    if parts[-1] in FILE_SUFFIXES or any(p.isupper() for p in parts[1:]):
        return None  # a file name (``metrics.jsonl``), a placeholder (``relay.tar.NN``)
    if parts[-1] in HOST_SUFFIXES:
        return None  # a host name (``learner.seedrl.svc.cluster.local``)
    if name.startswith("seedrl.v1"):  # the wire contract's package
        rest = parts[2:]
        ok = not rest or _resolve_class_path(".".join(rest)) or rest[0] in _proto_names()
        return None if ok else "is not in protos/seedrl/proto/seedrl.proto"
    if parts[0] in PROJECT_PACKAGES:
        return None if _resolve_module_path(name) else "does not import"
    if parts[0][0].isupper():
        if parts[0] not in _project_classes() and parts[0] not in _proto_names():
            return f"names no project class or wire message {parts[0]}"
        return None if _resolve_class_path(name) else "has no such attribute"
    return None  # a library's (``torch.compile``) or a variable's (``result.frames``)


def test_every_repository_path_the_docs_name_exists() -> None:
    """A path that starts at one of the repository's top folders (``learner/run.py``,
    ``deploy/k8s/``) must exist, in prose, code spans and code blocks alike. ``{a,b}``
    expands; a capitalised placeholder (``NAME``, ``SUITE``, ``seedN``) or ``<pid>``
    matches anything; a path git ignores is one a command makes (``deploy/seedrl.env``)
    and passes. URLs are left out."""
    missing = sorted(
        {
            f"{doc}: {path}"
            for doc, path in _named(PATH)
            if not any(glob.glob(p, root_dir=ROOT) for p in _path_patterns(path))
            and not _ignored_by_git(path.rstrip(".,;:"))
        }
    )
    assert not missing, "the docs name paths that do not exist:\n" + "\n".join(missing)


def test_every_code_name_the_docs_use_exists() -> None:
    """Every dotted name of ours in README.md and docs/**/*.md exists, in prose, code spans
    and code blocks alike (shell blocks included: ``python -m benchmarks.echo`` names a
    module too):

    - ``package.module.Symbol.attr`` under seedrl, learner, actors or benchmarks: the
      longest importable prefix is imported and the rest found with getattr;
    - ``Class.attr`` (a capitalised head): some project class of that name (found by
      reading the packages' sources), or a message or service of the wire contract, has
      the attribute; instance attributes count when the class declares or assigns them;
    - ``seedrl.v1...``: the proto package and its messages.

    Other dotted words are a library's (``torch.compile``), a variable's
    (``result.frames``) or a file's (``metrics.jsonl``) and are not checked. A renamed
    or removed function, class or module therefore fails here, not in a reader's hands.
    """
    problems = sorted(
        {
            f"{doc}: {name} {problem}"
            for doc, name in _named(DOTTED)
            if (problem := _dotted_name_problem(name)) is not None
        }
    )
    assert not problems, "the docs name code that does not exist:\n" + "\n".join(problems)


def test_every_class_the_docs_name_in_code_exists() -> None:
    """A capitalised identifier in a code span (`DynamicBatcher`, `ReadActions`) is a
    project class, a wire message, service or RPC, a Python builtin, or a word some
    tracked source file spells out (the C++ actor's names, a library class the code
    uses), or one of the few library names in EXTERNAL_NAMES: a class renamed or removed
    everywhere in the code fails here."""
    proto = _proto_names()
    known = set(_project_classes()) | set(proto) | {m for ms in proto.values() for m in ms}
    known |= _code_words() | set(dir(builtins)) | EXTERNAL_NAMES
    unknown = sorted(
        {
            f"{doc.relative_to(ROOT)}: {name}"
            for doc in DOCS
            for lang, text in _chunks(doc.read_text())
            if lang == "prose"
            for name in CODE_SPAN.findall(text)
            if BARE_CLASS.match(name) and name not in known
        }
    )
    assert not unknown, "the docs name classes that do not exist:\n" + "\n".join(unknown)
