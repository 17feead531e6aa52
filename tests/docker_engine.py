"""A Docker engine for the cluster test: the one that answers, or a dockerd of our own.

Our own dockerd gets its own data root (under the cache, so image layers survive between
runs), exec root, pidfile and socket (under a private temp dir), and is stopped by pid.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path


class EngineUnavailable(Exception):
    """Why no Docker engine can be had here (the test skips with this reason)."""


def answers(env: dict[str, str]) -> bool:
    """Whether the engine that ``env`` points the docker client at responds."""
    try:
        done = subprocess.run(
            ["docker", "version", "--format", "{{.Server.Version}}"],
            env=env,
            capture_output=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def compose_command(env: dict[str, str]) -> list[str]:
    """``docker compose`` (the plugin) or ``docker-compose`` (v1), whichever is installed."""
    probe = subprocess.run(["docker", "compose", "version"], env=env, capture_output=True)
    if probe.returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise EngineUnavailable("neither 'docker compose' nor docker-compose is installed")


@contextlib.contextmanager
def docker_engine(data_root: Path) -> Iterator[dict[str, str]]:
    """An environment whose DOCKER_HOST reaches a working engine, started if need be."""
    if shutil.which("docker") is None:
        raise EngineUnavailable("no docker client (apt-get install docker.io)")
    env = dict(os.environ)
    if answers(env):
        yield env
        return
    if os.geteuid() != 0:
        raise EngineUnavailable("no Docker engine answers, and starting dockerd needs root")
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise EngineUnavailable("no Docker engine answers and dockerd is not installed")
    data_root.mkdir(parents=True, exist_ok=True)
    # A short path: unix socket names are limited to about 100 bytes.
    run = Path(tempfile.mkdtemp(prefix="seedrl-dockerd-"))
    socket, pidfile, log = run / "docker.sock", run / "dockerd.pid", run / "dockerd.log"
    command = [
        dockerd, "--data-root", str(data_root), "--exec-root", str(run / "exec"),
        "--pidfile", str(pidfile), "--host", f"unix://{socket}",
    ]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    env["DOCKER_HOST"] = f"unix://{socket}"
    try:
        deadline = time.monotonic() + 90
        while not answers(env):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace").splitlines()[-5:]
                raise EngineUnavailable(f"dockerd did not start: {' | '.join(tail)}")
            time.sleep(0.5)
        yield env
    finally:
        pid = int(pidfile.read_text()) if pidfile.exists() else proc.pid
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(run, ignore_errors=True)
