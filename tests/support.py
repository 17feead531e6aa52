"""Helpers for tests that run real learner/actor OS processes on loopback, and one that
trains the learner's parts synchronously in this process.

Every process started here is ended by the context manager that started it, and every
wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from learner.state.trajectories import Unrolls
from seedrl.commands import actors_command
from seedrl.config import ActorConfig
from seedrl.transport import free_port

ROOT = Path(__file__).resolve().parents[1]


def certs_script() -> Any:
    """deploy/certs.py, what `make cluster` / `make k8s-secret` run (a script, not a
    package), loaded as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("deploy_certs", ROOT / "deploy" / "certs.py")
    assert spec is not None and spec.loader is not None
    certs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(certs)
    return certs


class Proc:
    """A child process whose combined output is collected line by line in the background."""

    def __init__(
        self,
        args: Sequence[str],
        env: dict[str, str] | None = None,
        preexec_fn: Any = None,
    ) -> None:
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.args = list(args)
        self.popen = subprocess.Popen(
            self.args,
            cwd=ROOT,
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            preexec_fn=preexec_fn,
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.append(line.rstrip("\n"))
            self._queue.put(line)

    def wait_for(self, text: str, timeout: float) -> str:
        """The first output line containing ``text``; fails after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        for line in list(self.lines):
            if text in line:
                return line
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=max(0.01, min(0.2, deadline - time.monotonic())))
            except queue.Empty:
                if self.popen.poll() is not None and self._queue.empty():
                    break
                continue
            if text in line:
                return line
        raise AssertionError(f"{text!r} not seen within {timeout} s; output:\n{self.output()}")

    def output(self) -> str:
        return "\n".join(self.lines[-80:])

    def wait(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(
                f"process still running after {timeout} s:\n{self.output()}"
            ) from exc

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)

    def kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM, wait, then SIGKILL the whole process group."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(grace)
        self.kill_group()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)
        self._reader.join(timeout=2)
        return self.popen.returncode


def learner_args(port: int, logdir: Path, *extra: str) -> list[str]:
    """A learner's command line; it serves in one process (``--serving-processes auto``
    would depend on the test host's cores) unless ``extra`` gives its own count."""
    return [
        sys.executable, "-m", "learner", "--port", str(port), "--logdir", str(logdir),
        "--progress", "plain", "--log-interval-s", "1", "--no-tensorboard",
        "--serving-processes", "0", *extra,
    ]  # fmt: skip


def actor_args(port: int, num_actors: int = 1, envs: int = 4, *extra: str) -> list[str]:
    config = ActorConfig(learner=f"127.0.0.1:{port}", num_actors=num_actors, envs_per_actor=envs)
    return [*actors_command(config), *extra]


@contextlib.contextmanager
def running(
    args: Sequence[str], env: dict[str, str] | None = None, preexec_fn: Any = None
) -> Iterator[Proc]:
    proc = Proc(args, env, preexec_fn)
    try:
        yield proc
    finally:
        proc.stop()


@contextlib.contextmanager
def learner_process(
    tmp_path: Path,
    *extra: str,
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
    preexec_fn: Any = None,
) -> Iterator[tuple[Proc, int]]:
    """A learner on a free loopback port, waited on until it listens (``preexec_fn`` runs
    in the child before the learner starts, e.g. to lower a resource limit)."""
    port = free_port()
    with running(learner_args(port, tmp_path, *extra), env, preexec_fn) as proc:
        proc.wait_for("listening on", timeout)
        yield proc, port


def actors_reach_every_frontend(
    learner: Proc, actors: ActorConfig, frontends: int, env: dict[str, str]
) -> None:
    """Run ``actors`` until each of the learner's serving frontends has admitted one (the
    learner logs at INFO), then stop them."""
    with running(actors_command(actors), env=env):
        for index in range(frontends):
            learner.wait_for(f"frontend {index} learner.serving.servicer: actor", 120)


def read_records(logdir: Path) -> list[dict[str, Any]]:
    path = logdir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_until(
    predicate: Any, timeout: float, interval: float = 0.2, what: str = "condition"
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"{what} not reached within {timeout} s")


def random_unrolls(n: int, length: int, seed: int = 0, discount: float | None = 0.99) -> Unrolls:
    """``n`` CartPole-shaped unrolls of ``length`` transitions, random, no episode ends,
    with each row's discounted reward sum so far (the episodes start at row 0; none
    without ``discount``), which a learner normalising returns reads."""
    rng = np.random.default_rng(seed)
    rows = length + 1
    obs = rng.normal(size=(n, rows, 4)).astype(np.float32)
    reward = rng.normal(size=(n, rows)).astype(np.float32)
    running = None
    if discount is not None:
        running = np.array(
            [[sum(discount ** (t - m) * float(r[m]) for m in range(t + 1)) for t in range(rows)]
             for r in reward],
            np.float32,
        )  # fmt: skip
    return Unrolls(
        obs=obs,
        first=np.zeros((n, rows), bool),
        reward=reward,
        terminated=np.zeros((n, rows), bool),
        truncated=np.zeros((n, rows), bool),
        action=rng.integers(0, 2, size=(n, rows)),
        policy_params=rng.normal(size=(n, rows, 2)).astype(np.float32),
        core_state=(),
        acted_step=np.zeros((n, rows), np.int64),
        running_return=running,
    )


def small_learner(tmp_path: Path, length: int, batch: int, **overrides: Any) -> Any:
    """A CartPole learner with short unrolls and a small batch, built as ``serve`` builds it."""
    from learner.parts import build_learner  # torch loads only for the tests that need it
    from seedrl.config import LearnerConfig

    config = LearnerConfig(
        logdir=str(tmp_path), unroll_length=length, batch_size=batch,
        max_queue_unrolls=4 * batch, **overrides,
    )  # fmt: skip
    return build_learner(config)


def engine_for(
    model: Any,
    head: Any,
    device: Any,
    builder: Any,
    queue: Any,
    stats: Any,
    weights_lock: Any,
    learner_step: Any,
    backend: str = "auto",
    seed: int | tuple[int, ...] = 0,
    precision: str = "fp32",
    **kwargs: Any,
) -> Any:
    """An inference engine running the V-trace agent's policy (``inference_policy``) over
    ``model``: what ``learner.run.make_engine`` builds, from loose parts."""
    from learner.agents.policy import inference_policy
    from learner.serving.inference import InferenceEngine

    policy = inference_policy(model, head, device, backend, seed, precision)
    return InferenceEngine(policy, builder, queue, stats, weights_lock, learner_step, **kwargs)
