"""The actor launcher: start N actors in processes, supervise them, stop them together.

Up to ``PROCESSES_PER_CPU`` processes per CPU each run one actor; beyond that, actors
share processes, one thread and one stream each (``--actors-per-process``,
:func:`actors.placement.actor_process_sizes`). Hundreds of processes on a few cores make
every round trip slower (each brings its own pages to the caches and the TLB), and an
actor thread spends its round trip in gRPC with the GIL released. The launcher
restarts a process that dies with an error (with backoff); inside a process, a
crashed actor thread is restarted the same way (``actors.process``). It forwards
SIGINT/SIGTERM to every process and exits 0 once all of them have exited 0 (the
learner said training is finished).

By default (``--start-method fork``) the launcher imports the actor's modules once and
forks every actor from itself: the actors then share the interpreter's and the
modules' memory pages, and with many actors per core the CPU caches hold one copy of
them instead of one per actor, so round trips run faster and each actor costs less
memory. The launcher never opens a gRPC channel, so each child starts
gRPC fresh. ``--start-method exec`` starts ``python -m actors actor`` instead.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import random
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Sequence
from typing import NoReturn, Protocol

from actors.placement import actor_cpus, actor_process_sizes, usable_cpu_count
from actors.restarts import CrashRestarts
from seedrl.cli import parse_config
from seedrl.commands import actors_command, secret_env
from seedrl.config import ActorConfig

log = logging.getLogger(__name__)

POLL_S = 0.2
STOP_GRACE_S = 5.0
RANDOM_INDEX_RANGE = 1 << 20


def process_config(config: ActorConfig, index: int, count: int = 1, cpu: int = -1) -> ActorConfig:
    """The config of the process running actors ``index`` .. ``index + count - 1`` on
    ``cpu``: the launcher's own plan (how many per process, which CPUs, how to start
    them) stays with the launcher; the rest passes on as the user gave it."""
    return dataclasses.replace(
        config,
        first_index=index,
        num_actors=count,
        cpu=cpu,
        actors_per_process=_LAUNCHER_DEFAULTS.actors_per_process,
        pin_cpus=_LAUNCHER_DEFAULTS.pin_cpus,
        start_method=_LAUNCHER_DEFAULTS.start_method,
    )


_LAUNCHER_DEFAULTS = ActorConfig()


class ActorProcess(Protocol):
    """What the launcher needs of an actor process (``subprocess.Popen`` has it)."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...
    def send_signal(self, sig: int) -> None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def kill(self) -> None: ...


class ForkedActor:
    """An actor process forked from the launcher, with the ``Popen`` surface it uses.

    The child gets its :class:`~seedrl.config.ActorConfig` as the object itself (it
    shares the launcher's memory), not as flags to parse again.
    """

    def __init__(self, config: ActorConfig) -> None:
        self.returncode: int | None = None
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _run_forked_actor(config)
        self.pid = pid

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"actor pid {self.pid}", timeout or 0.0)
            time.sleep(0.02)
        return code

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _run_forked_actor(config: ActorConfig) -> NoReturn:
    """The forked child: run the actor process and leave without the launcher's atexit."""
    # Objects from before the fork go where the garbage collector never looks, so no
    # collection here writes to (and so copies) the pages every actor shares.
    gc.freeze()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    code = 1
    try:
        from actors.process import run_process  # loaded before the fork (Launcher.start)

        code = run_process(config)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class Launcher:
    """Owns the actor processes, each known by the index of its first actor."""

    def __init__(self, config: ActorConfig) -> None:
        self.config = config
        self.procs: dict[int, ActorProcess] = {}
        self.restarts = 0
        self._stopping = False
        self._next_start: dict[int, float] = {}
        self._crashes: dict[int, CrashRestarts] = {}
        self._started: dict[int, float] = {}
        self._sizes: dict[int, int] = {}
        """How many actors each process runs."""
        self._cpus: dict[int, int] = {}
        """Each process's CPU (-1: any); a restarted process keeps its own."""

    def start(self) -> None:
        first = self.config.first_index
        if first < 0:  # identical replicas: distinct env seeds and a spread over learner ranks
            first = random.SystemRandom().randrange(RANDOM_INDEX_RANGE)
        sizes = actor_process_sizes(
            self.config.num_actors, self.config.actors_per_process, usable_cpu_count()
        )
        if self.config.cpu >= 0:
            cpus = [self.config.cpu] * len(sizes)
        else:
            cpus = actor_cpus(len(sizes), self.config.pin_cpus)
        if self.config.start_method == "fork":
            import actors.process  # noqa: F401  (what every actor runs, loaded once, shared)
        index = first
        for size, cpu in zip(sizes, cpus, strict=True):
            self._sizes[index] = size
            self._cpus[index] = cpu
            self._spawn(index)
            index += size

    def _spawn(self, index: int) -> None:
        cpu, size = self._cpus.get(index, -1), self._sizes.get(index, 1)
        config = process_config(self.config, index, size, cpu)
        if self.config.start_method == "fork":
            self.procs[index] = ForkedActor(config)
        else:
            command = actors_command(config, "actor")
            self.procs[index] = subprocess.Popen(command, env=secret_env(config, os.environ))
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
                crashes = self._crashes.setdefault(index, CrashRestarts())
                delay = crashes.delay(now - self._started.get(index, now))
                log.warning(
                    "actor process %d (actors %d-%d) exited with %d; restarting in %.1f s",
                    proc.pid, index, index + self._sizes.get(index, 1) - 1, code, delay,
                )  # fmt: skip
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
    envs = config.envs_per_actor or "the learner's advised number of"  # chosen after GetInfo
    print(
        f"seedrl actors: {config.num_actors} actors x {envs} envs in "
        f"{len(launcher.procs)} processes -> {config.learner}",
        flush=True,
    )
    try:
        while not stop_requested and launcher.poll():
            time.sleep(POLL_S)
    finally:
        launcher.stop()
    return 0 if stop_requested else launcher.exit_code()


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_config(
        ActorConfig,
        argv,
        "python -m actors",
        "Start N seedrl actors that step envs and stream frames to a learner.",
        check_files=True,
    )
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return run(config)
