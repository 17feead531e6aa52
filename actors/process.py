"""One actor process: its actors on threads, their restarts, signals, CPU placement.

The launcher (``actors.launcher``) starts these processes; each runs ``--num-actors``
actors from ``--first-index`` on, one :class:`~actors.actor.Actor` and one stream per
thread (``run_process``). While one thread steps its envs (holding the GIL), the
others wait for their actions in gRPC with the GIL released. SIGINT/SIGTERM end every
actor of the process with exit code 0.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType

from actors.actor import Actor
from actors.restarts import CrashRestarts
from seedrl.cli import parse_config
from seedrl.config import ActorConfig
from seedrl.timing import process_rss_mb

log = logging.getLogger(__name__)


class ActorStopped(BaseException):
    """Raised by the SIGINT/SIGTERM handler, like KeyboardInterrupt: ends the actor with 0."""


def _raise_stopped(signum: int, frame: FrameType | None) -> None:
    raise ActorStopped(signal.Signals(signum).name)


def _run_until_signal(actor: Actor) -> int:
    """Run one actor on this thread; SIGINT/SIGTERM end it with 0 (and its stream with it)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _raise_stopped)
    start = time.perf_counter()
    try:
        return actor.run()
    except ActorStopped:
        return 0
    finally:
        wall = time.perf_counter() - start
        log.info(
            "actor %s: %d frames in %.1f s (%.0f/s), %d connections, RSS %.1f MB",
            actor.actor_id, actor.frames, wall, actor.frames / max(wall, 1e-9),
            actor.connections, process_rss_mb(),
        )  # fmt: skip


THREAD_STOP_GRACE_S = 5.0


class ActorThread(threading.Thread):
    """One actor on a thread of its own, started afresh after a crash.

    A crash (an exception out of ``Actor.run``) costs that actor's partial unroll, not
    its neighbours' in the process: after :class:`~actors.launcher.CrashRestarts`' wait a
    new actor with the same index takes over (unless ``restart`` is off).
    """

    def __init__(self, make_actor: Callable[[], Actor], restart: bool, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self._make_actor = make_actor
        self.actor = make_actor()
        self.restart = restart
        self.code = 1
        """The actor's exit code once the thread has ended (1 after a crash)."""
        self.crashes = 0
        self._stopping = threading.Event()

    def run(self) -> None:
        backoff = CrashRestarts()
        while True:
            started = time.monotonic()
            try:
                self.code = self.actor.run()
                return
            except Exception:
                log.exception("actor %s failed", self.actor.actor_id)
                self.code = 1
                self.crashes += 1
            if not self.restart:
                return
            delay = backoff.delay(time.monotonic() - started)
            log.warning("actor %s: restarting in %.1f s", self.actor.actor_id, delay)
            if self._stopping.wait(delay):
                return
            self.actor = self._make_actor()
            if self._stopping.is_set():  # stop() may have seen only the crashed actor
                return

    def stop(self) -> None:
        """End the actor soon (safe from another thread); no restart after it."""
        self._stopping.set()
        self.actor.stop()


def _run_threads(config: ActorConfig) -> int:
    """This process's A actors x G env groups, one stream and one :class:`ActorThread` each.

    While one thread steps its envs (holding the GIL), the others wait for their actions
    in gRPC with the GIL released. Actor ``i``'s group ``g`` runs as actor index
    ``i * G + g`` with K / G envs, so seeds and ids stay distinct. The exit code is the
    worst of the threads'.
    """
    groups = config.env_groups
    stream_config = dataclasses.replace(
        config, envs_per_actor=config.envs_per_actor // groups, env_groups=1, num_actors=1
    )
    actor_indices = range(config.first_index, config.first_index + config.num_actors)
    threads = [
        ActorThread(functools.partial(Actor, stream_config, i * groups + g), config.restart,
                    name=f"actor-{i * groups + g}")
        for i in actor_indices
        for g in range(groups)
    ]  # fmt: skip
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _raise_stopped)
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join()
    except ActorStopped:
        for thread in threads:
            thread.stop()
        for thread in threads:
            thread.join(THREAD_STOP_GRACE_S)
        return 0
    return max(thread.code for thread in threads)


def mark_batch_work() -> bool:
    """Put this process in Linux's SCHED_BATCH class; False where there is none.

    A waking batch task never preempts the running one, so hundreds of actors sharing a
    host wake without kicking the learner (or each other) off a core mid-slice: fewer
    context switches and warmer caches. No privilege needed; nice stays.
    """
    policy = getattr(os, "SCHED_BATCH", None)
    if policy is None or not hasattr(os, "sched_setscheduler"):
        return False
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))
    except OSError:
        return False
    return True


def pin_to_cpu(cpu: int) -> bool:
    """Run this process, every thread it has and will start, on ``cpu`` alone.

    The scheduler otherwise moves actors between cores, and a moved actor wakes into
    cold caches (what Sample Factory pins its workers against). False, with a warning,
    where that CPU cannot be had.
    """
    if not hasattr(os, "sched_setaffinity"):
        log.warning("cannot pin to CPU %d: no CPU affinity on this platform", cpu)
        return False
    try:
        # Threads started later inherit the mask; the ones already there need their own.
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    try:
        for tid in threads:
            os.sched_setaffinity(tid, {cpu})
    except OSError as exc:
        log.warning("cannot pin to CPU %d (%s); running on any CPU", cpu, exc.strerror)
        return False
    return True


def run_process(config: ActorConfig) -> int:
    """Run this process's actors (``config`` as the launcher decided it) to the end;
    returns the exit code (the worst of its actors')."""
    logging.basicConfig(
        level=os.environ.get("SEEDRL_LOG_LEVEL", "WARNING"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if config.nice:
        os.nice(config.nice)
    if config.sched_batch:
        mark_batch_work()
    if config.cpu >= 0:
        pin_to_cpu(config.cpu)
    if config.num_actors * config.env_groups > 1:
        return _run_threads(config)
    return _run_until_signal(Actor(config, index=config.first_index))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m actors actor``: one actor process, as the launcher's exec mode starts it."""
    config = parse_config(
        ActorConfig,
        argv,
        "python -m actors actor",
        "Run ONE seedrl actor process (the launcher starts these: see python -m actors).",
        check_files=True,
    )
    return run_process(config)
