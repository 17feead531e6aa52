"""The compose cluster for real: offline image builds, `make cluster`, scale, crash, down.

Builds the Debian base image (deploy/base-image.sh) and both images from a wheelhouse
with no network (`make images`), brings up a learner and 4 actors with `make cluster`
(over TLS with the CA and certificate it generates: a plaintext client is refused, the
run directory is private and neither config.json nor the checkpoint carries the token),
watches frames and learner steps grow in the learner's metrics, scales to 8 actors, kills
the learner's process (a crash: Docker's restart policy brings it back and --resume
continues from the checkpoint while the very same actor containers reconnect), and
checks that `make cluster-down` leaves no container, network or volume behind.

Run with `make test-cluster` (excluded from `make test`). It uses the Docker engine that
answers, or starts its own dockerd as root. The base image's root filesystem, the
wheelhouse and the engine's image layers are cached under $SEEDRL_CACHE (default
~/.cache/seedrl), so a second run skips debootstrap, pip and most of the image builds.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from docker_engine import EngineUnavailable, compose_command, docker_engine
from support import ROOT, free_port, wait_until

from learner.state import checkpoint

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(2400)]

CACHE = Path(os.environ.get("SEEDRL_CACHE", Path.home() / ".cache" / "seedrl"))
BASE_IMAGE = "seedrl-base:bookworm"
TAG = "cluster-test"
IMAGES = {"learner": f"seedrl-learner:{TAG}", "actor": f"seedrl-actor:{TAG}"}
# A folder in the build context (.dockerignore lets deploy/wheelhouse through).
WHEELHOUSE = Path("deploy/wheelhouse/cluster-test")
ENV_FILE = ROOT / "deploy" / "seedrl.env"
TLS_DIR = ROOT / "deploy" / "tls"
COMPOSE_FILE = ROOT / "deploy" / "docker-compose.yml"
CHECKPOINT_INTERVAL_S = 5


def docker(env: dict[str, str], *args: str, timeout: float = 120) -> str:
    done = subprocess.run(
        ["docker", *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"docker {' '.join(args)}: {done.stderr.strip()}"
    return done.stdout.strip()


def step(what: str, started: float) -> None:
    print(f"cluster test: {what} at {time.monotonic() - started:.0f} s", flush=True)


@pytest.fixture(scope="module")
def engine() -> Iterator[dict[str, str]]:
    try:
        with docker_engine(CACHE / "dockerd") as env:
            yield env
    except EngineUnavailable as exc:
        pytest.skip(f"no Docker engine: {exc}")


def ensure_base_image(env: dict[str, str]) -> None:
    """deploy/base-image.sh, importing the cached root filesystem when there is one."""
    with contextlib.suppress(AssertionError):
        docker(env, "image", "inspect", BASE_IMAGE)
        return
    tarball = CACHE / "base-bookworm.tar"
    if not tarball.exists() and (os.geteuid() != 0 or shutil.which("debootstrap") is None):
        pytest.skip("building the base image needs root and debootstrap (apt-get install it)")
    done = subprocess.run(
        ["deploy/base-image.sh", BASE_IMAGE],
        cwd=ROOT,
        env={**env, "SEEDRL_BASE_TARBALL": str(tarball)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr


def cached_wheelhouse() -> Path:
    """Wheels for the package and its learner extra, keyed by pyproject.toml's content."""
    if sys.version_info[:2] != (3, 11):
        pytest.skip("the wheelhouse is built by this Python and must be 3.11, bookworm's")
    key = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]
    wheels = CACHE / f"wheelhouse-{key}"
    if not wheels.exists():
        partial = CACHE / f"wheelhouse-{key}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(partial)]
        done = subprocess.run(
            [*command, ".[learner]", "setuptools>=77"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, done.stderr
        for own in partial.glob("seedrl-*.whl"):  # the images install the sources themselves
            own.unlink()
        partial.rename(wheels)
    return wheels


@contextlib.contextmanager
def wheelhouse_in_context() -> Iterator[Path]:
    """The cached wheels hard-linked (or copied) into the build context, removed after."""
    target = ROOT / WHEELHOUSE
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    try:
        for wheel in cached_wheelhouse().glob("*.whl"):
            try:
                os.link(wheel, target / wheel.name)
            except OSError:
                shutil.copy2(wheel, target / wheel.name)
        yield target
    finally:
        shutil.rmtree(target, ignore_errors=True)


@contextlib.contextmanager
def secret_files() -> Iterator[str]:
    """deploy/seedrl.env as `make cluster` would write it (yields its token); that file and
    deploy/tls, which `make cluster` writes when missing, are removed after if they were
    not there before."""
    made_env, made_tls = not ENV_FILE.exists(), not TLS_DIR.exists()
    if made_env:
        ENV_FILE.write_text(f"SEEDRL_AUTH_TOKEN={secrets.token_urlsafe(32)}\n")
        ENV_FILE.chmod(0o600)
    try:
        yield ENV_FILE.read_text().strip().partition("=")[2]
    finally:
        if made_env:
            ENV_FILE.unlink()
        if made_tls:
            shutil.rmtree(TLS_DIR, ignore_errors=True)


def image_sizes(env: dict[str, str]) -> dict[str, int]:
    return {
        role: int(docker(env, "image", "inspect", "--format", "{{.Size}}", image))
        for role, image in IMAGES.items()
    }


def run_in(env: dict[str, str], image: str, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", "sh", image, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


class Cluster:
    """One compose project: `make cluster` / `make cluster-down` and what they left."""

    def __init__(self, env: dict[str, str], project: str, port: int) -> None:
        self.project = project
        self.env = {
            **env,
            "SEEDRL_TAG": TAG,
            "SEEDRL_BASE_IMAGE": BASE_IMAGE,
            "SEEDRL_WHEELHOUSE": str(WHEELHOUSE),
            "SEEDRL_PORT": str(port),
            "SEEDRL_CHECKPOINT_INTERVAL_S": str(CHECKPOINT_INTERVAL_S),
        }
        self.compose = [*compose_command(env), "-p", project, "-f", str(COMPOSE_FILE)]

    def make(self, target: str, *variables: str) -> None:
        done = subprocess.run(
            ["make", "--no-print-directory", target, f"CLUSTER={self.project}", *variables],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=1800,  # a cold `make images` on a busy 2-core machine
        )
        assert done.returncode == 0, f"make {target}:\n{done.stdout}\n{done.stderr}"

    def run(self, *args: str) -> str:
        done = subprocess.run(
            [*self.compose, *args], env=self.env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, f"compose {' '.join(args)}: {done.stderr}"
        return done.stdout

    def containers(self, service: str = "") -> list[str]:
        label = f"label=com.docker.compose.project={self.project}"
        args = ["ps", "-aq", "--filter", label]
        if service:
            args += ["--filter", f"label=com.docker.compose.service={service}"]
        return sorted(docker(self.env, *args).split())

    def leftovers(self) -> dict[str, list[str]]:
        label = f"label=com.docker.compose.project={self.project}"
        return {
            "containers": self.containers(),
            "networks": docker(self.env, "network", "ls", "-q", "--filter", label).split(),
            "volumes": docker(self.env, "volume", "ls", "-q", "--filter", label).split(),
        }

    def learner(self) -> str:
        (container,) = self.containers("learner")
        return container

    def inspect(self, container: str) -> dict[str, Any]:
        return json.loads(docker(self.env, "inspect", container))[0]

    def file(self, path: str) -> bytes | None:
        """A file of the learner container (running, restarting or stopped), or None."""
        done = subprocess.run(
            ["docker", "cp", f"{self.learner()}:{path}", "-"],
            env=self.env,
            capture_output=True,
            timeout=60,
        )
        if done.returncode != 0:
            return None
        with tarfile.open(fileobj=io.BytesIO(done.stdout)) as archive:
            member = archive.extractfile(archive.getmembers()[0])
            return member.read() if member is not None else None

    def print_diagnostics(self) -> None:
        """What a failed run on a CI host leaves to read: the learner's log and last records."""
        try:
            log = self.run("logs", "--no-color", "--tail", "60", "learner")
        # A failing or hung compose must not replace the failure being diagnosed.
        except (AssertionError, subprocess.TimeoutExpired) as exc:
            log = str(exc)
        print(f"cluster test: learner log (last 60 lines)\n{log}")
        keys = ("elapsed_s", "frames", "learner_steps", "actors_connected", "queue_unrolls")
        with contextlib.suppress(Exception):
            for record in self.records()[-3:]:
                print("cluster test: record", {k: record.get(k) for k in keys})

    def records(self) -> list[dict[str, Any]]:
        """The learner's metrics.jsonl (complete lines only)."""
        text = (self.file("/runs/latest/metrics.jsonl") or b"").decode()
        return [json.loads(line) for line in text.splitlines() if line.endswith("}")]


def last(cluster: Cluster, key: str) -> Any:
    records = cluster.records()
    return records[-1][key] if records else None


def test_compose_cluster_builds_offline_scales_survives_a_crash_and_leaves_nothing(
    engine, tmp_path
):
    started = time.monotonic()
    ensure_base_image(engine)
    step("base image ready", started)
    port = free_port()
    cluster = Cluster(engine, f"seedrltest{os.getpid()}", port)
    with wheelhouse_in_context(), secret_files() as token:
        # `make images` as `make cluster` runs it, with no network at all.
        cluster.make("images", "BUILD_FLAGS=--network none")
        step(f"images built offline, sizes {image_sizes(engine)}", started)
        # Installed from wheels only: no torch in the actor image, no compiler or pip anywhere.
        no_torch = "python -c 'import importlib.util as u; assert u.find_spec(\"torch\") is None'"
        assert run_in(engine, IMAGES["actor"], no_torch).returncode == 0
        assert run_in(engine, IMAGES["learner"], "python -c 'import torch'").returncode == 0
        for image in IMAGES.values():
            tools = run_in(engine, image, "for t in gcc cc make pip pip3; do command -v $t; done")
            assert tools.stdout.strip() == "", (image, tools.stdout)
            assert run_in(engine, image, "test ! -e /wheelhouse && test ! -e /src").returncode == 0

        try:
            run_cluster(cluster, port, tmp_path, started, token)
        except BaseException:
            cluster.print_diagnostics()
            raise
        finally:
            cluster.make("cluster-down")
    assert cluster.leftovers() == {"containers": [], "networks": [], "volumes": []}
    step("down: nothing left", started)


def run_cluster(cluster: Cluster, port: int, tmp_path: Path, started: float, token: str) -> None:
    cluster.make("cluster", "N=4")
    learner = cluster.learner()
    wait_until(
        lambda: cluster.inspect(learner)["State"]["Health"]["Status"] == "healthy",
        300,
        interval=2,
        what="learner healthcheck",
    )
    step("learner healthy", started)
    # Published on loopback only, and reachable there: the host-side healthcheck passes.
    bindings = cluster.inspect(learner)["NetworkSettings"]["Ports"]["8686/tcp"]
    assert {b["HostIp"] for b in bindings} == {"127.0.0.1"}, bindings
    # Over TLS only: a plaintext client gets nowhere, one that trusts make cluster's CA
    # does (so actors, which verify it, talk to this learner and no other).
    check = [sys.executable, "-m", "learner", "healthcheck", "--address", f"127.0.0.1:{port}"]
    assert subprocess.run(check, capture_output=True, timeout=60).returncode == 1
    tls = ["--tls-ca", str(TLS_DIR / "ca.pem")]
    assert subprocess.run([*check, *tls], capture_output=True, timeout=60).returncode == 0
    step("learner serves TLS only", started)
    # Every container sits on this project's network and on no other.
    for container in cluster.containers():
        networks = set(cluster.inspect(container)["NetworkSettings"]["Networks"])
        assert networks == {f"{cluster.project}_default"}, networks

    wait_until(lambda: last(cluster, "actors_connected") == 4, 240, interval=2, what="4 actors")
    # The actors may connect before the trainer's first step: growing from whatever the
    # first record holds, zero included, is what shows training.
    first = cluster.records()[-1]
    wait_until(
        lambda: (
            last(cluster, "frames") > first["frames"]
            and last(cluster, "learner_steps") > first["learner_steps"]
        ),
        240,
        interval=2,
        what="frames and learner steps growing",
    )
    step(f"4 actors training (learner step {first['learner_steps']} when they were)", started)
    # The run directory is the learner's alone, and its config does not carry the token.
    mode = docker(cluster.env, "exec", learner, "stat", "-c", "%a", "/runs/latest")
    assert mode == "700", mode
    config = cluster.file("/runs/latest/config.json")
    assert config is not None and token.encode() not in config

    cluster.run("up", "--detach", "--no-build", "--no-recreate", "--scale", "actor=8")
    assert len(cluster.containers("actor")) == 8
    wait_until(lambda: last(cluster, "actors_connected") == 8, 240, interval=2, what="8 actors")
    step("scaled to 8 actors", started)

    crash_and_resume(cluster, learner, tmp_path, started)


def crash_and_resume(cluster: Cluster, learner: str, tmp_path: Path, started: float) -> None:
    """SIGKILL the learner's process: restarted by Docker, resumed, same actors back."""
    wait_until(
        lambda: cluster.file("/runs/latest/checkpoint.pt") is not None,
        60,
        interval=1,
        what="a checkpoint",
    )
    actors = {c: cluster.inspect(c)["State"]["StartedAt"] for c in cluster.containers("actor")}
    before_kill = cluster.records()
    state = cluster.inspect(learner)["State"]
    killed_at = time.time()  # records stamped later come from the restarted learner
    try:
        # What the OOM killer or a segfault does; `docker kill` would count as a manual
        # stop, which no restart policy undoes.
        os.kill(state["Pid"], signal.SIGKILL)
    except (PermissionError, ProcessLookupError):
        pytest.skip("killing the learner's process needs root on the engine's host")
    saved_bytes = cluster.file("/runs/latest/checkpoint.pt")
    assert saved_bytes is not None
    token = ENV_FILE.read_text().strip().partition("=")[2]
    assert token.encode() not in saved_bytes, "the checkpoint carries no token"
    copy = tmp_path / "checkpoint.pt"
    copy.write_bytes(saved_bytes)
    saved = checkpoint.load(copy)
    wait_until(
        lambda: (
            cluster.inspect(learner)["RestartCount"] == 1
            and cluster.inspect(learner)["State"]["Health"]["Status"] == "healthy"
        ),
        300,
        interval=2,
        what="the learner restarted by Docker and healthy",
    )
    step("learner restarted", started)

    def resumed() -> list[dict[str, Any]]:
        records = [r for r in cluster.records() if r["time"] > killed_at]
        ok = (
            records
            and records[-1]["actors_connected"] == 8
            and records[-1]["learner_steps"] > saved["learner_steps"] + 3
        )
        return records if ok else []

    after = wait_until(resumed, 300, interval=2, what="the 8 actors back, training resumed")
    step("8 actors reconnected after the restart", started)
    lost = before_kill[-1]["frames"] - saved["frames"] if before_kill else 0
    print(
        f"cluster test: checkpoint at frame {saved['frames']} step {saved['learner_steps']};"
        f" last record before the kill {before_kill[-1]['frames']} (not checkpointed: {lost});"
        f" first after the restart {after[0]['frames']} step {after[0]['learner_steps']}"
    )
    # --resume: counting goes on from the checkpoint, not from zero.
    assert after[0]["frames"] >= saved["frames"] > 0
    assert after[0]["learner_steps"] >= saved["learner_steps"] > 0
    # The same actor containers, never restarted: their processes reconnected on their own.
    now = {c: cluster.inspect(c)["State"]["StartedAt"] for c in cluster.containers("actor")}
    assert now == actors
    assert all(cluster.inspect(c)["RestartCount"] == 0 for c in actors)
