"""One virtual environment per peer, built on demand with pinned versions.

The peers cannot share seedrl's environment: Sample Factory 2.1 needs gymnasium < 1.0
and numpy < 2 (seedrl is on gymnasium 1.x and numpy 2), and neither peer belongs in
seedrl's dependencies. Each environment lives under ``root/<name>-<hash>``, where the
hash covers the pins and the Python version, so changing a pin builds a new one; a stamp
file, written last with the installed versions, makes every later run start at once.
"""

from __future__ import annotations

import hashlib
import json
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PINS: dict[str, tuple[str, ...]] = {
    "sb3": (
        "stable-baselines3==2.9.2",
        "torch==2.13.0",
        "gymnasium==1.4.0",
        "numpy==2.4.6",
    ),
    # torch 2.13 declares no numpy bound and runs with numpy 1.26; ale-py 0.9 registers
    # its ids with gymnasium 0.29 on import (and ships the ROMs).
    "sample-factory": (
        "sample-factory==2.1.1",
        "torch==2.13.0",
        "gymnasium==0.29.1",
        "numpy==1.26.4",
        "ale-py==0.9.1",
    ),
    # PufferLib 3 ships as an sdist whose setup.py imports torch and compiles against it,
    # so torch goes in first and PufferLib after it without build isolation (BUILT_AFTER);
    # its example configs want gymnasium 0.29 and numpy < 2, ale-py 0.9 for Atari.
    "pufferlib": (
        "torch==2.13.0",
        "gymnasium==0.29.1",
        "numpy==1.26.4",
        "ale-py==0.9.1",
    ),
    # Not a peer: the prioritized replays seedrl's own sum tree is measured against
    # (python -m benchmarks.replay_libs); torchrl 0.14 is the release for torch 2.13.
    "replay-libs": (
        "cpprb==11.0.0",
        "torchrl==0.14.1",
        "torch==2.13.0",
    ),
}
"""Every peer's requirements, the only place they are written."""
BUILT_AFTER: dict[str, tuple[str, ...]] = {"pufferlib": ("pufferlib==3.0.0",)}
"""Packages installed after the pins, built against them (``--no-build-isolation``)."""
STAMP = "peers-venv.json"
DEFAULT_ROOT = Path.home() / ".cache" / "seedrl" / "peers"
INSTALL_TIMEOUT_S = 1800.0
"""A cold install downloads and unpacks torch; past this something is stuck."""


class VenvError(RuntimeError):
    """The environment could not be built (the message says why, in a line or two)."""


@dataclass(frozen=True)
class Venv:
    name: str
    path: Path
    versions: dict[str, str]

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"


def venv_dir(root: Path, name: str, pins: tuple[str, ...]) -> Path:
    """Where ``name``'s environment for exactly these pins and this Python lives."""
    key = json.dumps([platform.python_version(), sorted(pins)])
    return root / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def read_stamp(path: Path) -> dict[str, Any] | None:
    try:
        stamp = json.loads((path / STAMP).read_text())
    except (OSError, ValueError):
        return None
    return stamp if isinstance(stamp, dict) else None


def ensure(name: str, root: Path = DEFAULT_ROOT, log: Path | None = None) -> Venv:
    """The peer's environment, built first if no finished build is there."""
    pins = PINS[name]
    later = BUILT_AFTER.get(name, ())
    path = venv_dir(root, name, pins + later)
    stamp = read_stamp(path)
    if stamp is not None:
        return Venv(name, path, dict(stamp.get("versions", {})))
    if path.exists():
        shutil.rmtree(path)  # a build that did not finish
    path.parent.mkdir(parents=True, exist_ok=True)
    out = log.open("a") if log else subprocess.DEVNULL
    try:
        _run([sys.executable, "-m", "venv", str(path)], out, "python -m venv")
        python = str(path / "bin" / "python")
        _run([python, "-m", "pip", "install", "--quiet", *pins], out, "pip install", log)
        if later:
            cmd = [python, "-m", "pip", "install", "--no-build-isolation", *later]
            _run(cmd, out, f"pip install --no-build-isolation {' '.join(later)}", log)
        freeze = subprocess.run(
            [python, "-m", "pip", "freeze"], capture_output=True, text=True, check=True
        ).stdout
    finally:
        if log:
            out.close()  # type: ignore[union-attr]
    versions = {
        name.lower().replace("_", "-"): version
        for name, version in (line.split("==", 1) for line in freeze.splitlines() if "==" in line)
    }
    (path / STAMP).write_text(json.dumps({"pins": list(pins), "versions": versions}, indent=1))
    return Venv(name, path, versions)


def _run(cmd: list[str], out: Any, what: str, log: Path | None = None) -> None:
    start = log.stat().st_size if log and log.exists() else 0
    try:
        subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=True,
                       timeout=INSTALL_TIMEOUT_S)  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise VenvError(f"{what} took longer than {INSTALL_TIMEOUT_S:.0f} s") from exc
    except subprocess.CalledProcessError as exc:
        cause = None
        if log:  # what this command wrote (the log may hold earlier attempts)
            with log.open("rb") as f:
                f.seek(start)
                cause = first_error(f.read().decode(errors="replace"))
        because = f": {cause}" if cause else ""
        raise VenvError(f"{what} exited with {exc.returncode}{because} (see the log)") from exc


ERROR_LINE = re.compile(r"^\s*(?:[\w.]+(?:Error|Exception)\b.*|ERROR: .*)$")
"""A line that names what went wrong: a Python exception (``urllib.error.URLError: ...``,
``NameError: ...``) or pip's own ``ERROR:``."""


def first_error(text: str) -> str | None:
    """The first line of a failed install's output that says what went wrong (a build's
    traceback ends in it; pip's summary lines after it only repeat that it failed)."""
    for line in text.splitlines():
        if ERROR_LINE.match(line) and "subprocess-exited-with-error" not in line:
            return line.strip()
    return None
