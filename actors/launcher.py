"""The actor launcher: start N actor processes, supervise them, stop them together.

Each actor is its own OS process (``python -m actors.actor``), so one crash costs one
actor. The launcher restarts an actor that dies with an error (with backoff), forwards
SIGINT/SIGTERM to all of them, and exits 0 once every actor has exited 0 (the learner
said training is finished).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from seedrl.config import ActorConfig, actor_cpus

log = logging.getLogger(__name__)

POLL_S = 0.2
STOP_GRACE_S = 5.0
RANDOM_INDEX_RANGE = 1 << 20
HEALTHY_RUN_S = 30.0
"""An actor that ran this long before crashing restarts with the shortest backoff again."""


def actor_command(config: ActorConfig, index: int, cpu: int = -1) -> list[str]:
    """The command line of actor ``index`` (same settings, its own index and CPU)."""
    args = [sys.executable, "-m", "actors.actor"]
    for f in dataclasses.fields(config):
        if f.name in ("num_actors", "first_index", "restart", "pin_cpus", "cpu"):
            continue
        value = getattr(config, f.name)
        if value is None:
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + f.name.replace("_", "-"))
        else:
            args += [flag, str(value)]
    args += ["--first-index", str(index)]
    if cpu >= 0:
        args += ["--cpu", str(cpu)]
    return args


class Launcher:
    """Owns the actor processes."""

    def __init__(self, config: ActorConfig) -> None:
        self.config = config
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.restarts = 0
        self._stopping = False
        self._next_start: dict[int, float] = {}
        self._failures: dict[int, int] = {}
        self._started: dict[int, float] = {}
        self._cpus: dict[int, int] = {}
        """Each actor's CPU (-1: any); a restarted actor keeps its own."""

    def start(self) -> None:
        first = self.config.first_index
        if first < 0:  # identical replicas: distinct env seeds and a spread over learner ranks
            first = random.SystemRandom().randrange(RANDOM_INDEX_RANGE)
        n = self.config.num_actors
        if self.config.cpu >= 0:
            cpus = [self.config.cpu] * n
        else:
            cpus = actor_cpus(n, self.config.pin_cpus)
        for index, cpu in zip(range(first, first + n), cpus, strict=True):
            self._cpus[index] = cpu
            self._spawn(index)

    def _spawn(self, index: int) -> None:
        command = actor_command(self.config, index, self._cpus.get(index, -1))
        self.procs[index] = subprocess.Popen(command)
        self._started[index] = time.monotonic()

    def poll(self) -> bool:
        """Reap and restart; True while any actor should still be running."""
        now = time.monotonic()
        running = False
        for index, proc in list(self.procs.items()):
            code = proc.poll()
            if code is None:
                running = True
                continue
            if code == 0 or self._stopping or not self.config.restart:
                continue
            if code == 2:  # configuration error (refused by the learner): restarting won't help
                continue
            due = self._next_start.get(index)
            if due is None:
                if now - self._started.get(index, now) >= HEALTHY_RUN_S:
                    self._failures[index] = 0  # a crash a day must not grow the backoff forever
                failures = self._failures.get(index, 0) + 1
                self._failures[index] = failures
                delay = min(30.0, 0.5 * 2 ** (failures - 1))
                log.warning("actor %d exited with %d; restarting in %.1f s", index, code, delay)
                self._next_start[index] = now + delay
                running = True
            elif now >= due:
                del self._next_start[index]
                self.restarts += 1
                self._spawn(index)
                running = True
            else:
                running = True
        return running

    def stop(self) -> None:
        """SIGTERM every actor, then SIGKILL what is still there after the grace period."""
        self._stopping = True
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in self.procs.values():
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def exit_code(self) -> int:
        codes = [p.returncode for p in self.procs.values()]
        return 0 if all(c == 0 for c in codes) else max(abs(c or 0) for c in codes) or 1


def run(config: ActorConfig) -> int:
    launcher = Launcher(config)
    stop_requested = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    launcher.start()
    print(
        f"seedrl actors: {config.num_actors} processes x {config.envs_per_actor} envs -> "
        f"{config.learner}",
        flush=True,
    )
    try:
        while not stop_requested and launcher.poll():
            time.sleep(POLL_S)
    finally:
        launcher.stop()
    return 0 if stop_requested else launcher.exit_code()


def main(argv: Sequence[str] | None = None) -> int:
    from seedrl.config import parse_config

    config = parse_config(
        ActorConfig,
        argv,
        "python -m actors",
        "Start N seedrl actor processes that step envs and stream frames to a learner.",
    )
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return run(config)
