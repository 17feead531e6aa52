"""Actors on this host for a learner started from Python or ``make demo``.

The demo and the Python API both run ``python -m actors`` beside their learner on
loopback; this is how they start it (its output to a log file, the token in the
environment) and how they end it once the learner has finished.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

from seedrl.commands import actors_command, secret_env
from seedrl.config import ActorConfig

EXIT_TIMEOUT_S = 20.0
"""How long the actor launcher gets to exit by itself after the learner finished."""
TERMINATE_TIMEOUT_S = 10.0
"""...and then after SIGTERM, before SIGKILL."""


def start_local_actors(config: ActorConfig, log_path: Path) -> subprocess.Popen[bytes]:
    """Start the actor launcher for ``config``; its output goes to ``log_path``.

    The checkout's root goes on ``PYTHONPATH``, so a script run from elsewhere starts
    the same ``actors`` package.
    """
    root = str(Path(__file__).resolve().parents[1])
    env = secret_env(config, os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log_file:
        return subprocess.Popen(
            actors_command(config), env=env, stdout=log_file, stderr=subprocess.STDOUT
        )


def stop_local_actors(actors: subprocess.Popen[bytes]) -> int | None:
    """The launcher exits when the learner says it finished; terminate it otherwise.

    Returns its exit code (None if it could not be reaped).
    """
    try:
        return actors.wait(timeout=EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        actors.terminate()
    try:
        return actors.wait(timeout=TERMINATE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        actors.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        return actors.wait(timeout=5)
    return None
