"""Actors pinned to CPUs: the launcher's plan, the flag it hands each actor, the real masks."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from support import running, wait_until
from wire_clients import child_pids

from actors.launcher import process_config
from actors.placement import actor_cpus
from seedrl.commands import actors_command
from seedrl.config import ActorConfig

UNREACHABLE = "127.0.0.1:9"  # nothing listens: actors keep retrying, which is all these need

linux_affinity = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or not Path("/proc/self/task").is_dir(),
    reason="Linux CPU affinity",
)


@pytest.mark.parametrize(
    ("n", "pin", "cpus", "expected"),
    [
        (4, "auto", [0, 1], [0, 1, 0, 1]),  # every CPU gets as many actors
        (3, "auto", [0, 1], [-1, -1, -1]),  # uneven: the scheduler balances better
        (1, "auto", [4, 5, 6, 7], [-1]),  # a lone replica on a bigger host
        (1, "auto", [5], [5]),  # a replica given one CPU
        (3, "on", [2, 3], [2, 3, 2]),
        (4, "off", [0, 1], [-1, -1, -1, -1]),
        (2, "on", [], [-1, -1]),  # no affinity on this platform
    ],
)
def test_the_launcher_spreads_actors_round_robin_when_it_fills_every_cpu(n, pin, cpus, expected):
    assert actor_cpus(n, pin, cpus) == expected


def test_pin_settings_are_checked():
    with pytest.raises(ValueError, match="--pin-cpus must be auto, on or off"):
        ActorConfig(pin_cpus="sometimes")
    with pytest.raises(ValueError, match="cpu must be a CPU number or -1"):
        ActorConfig(cpu=-2)


def test_each_actor_is_told_its_own_cpu_and_only_that():
    config = ActorConfig(learner=UNREACHABLE, pin_cpus="on")
    pinned = actors_command(process_config(config, 3, cpu=1), "actor")
    assert pinned[pinned.index("--cpu") + 1] == "1"
    assert pinned[pinned.index("--first-index") + 1] == "3"
    assert "--pin-cpus" not in pinned  # the plan is the launcher's, not the actor's
    assert "--cpu" not in actors_command(process_config(config, 3), "actor")


def _masks(pid: int) -> list[set[int]]:
    """The CPU mask of every thread of ``pid``."""
    masks = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            masks.append(os.sched_getaffinity(int(task.name)))
        except (ProcessLookupError, FileNotFoundError):
            continue  # a thread that just ended
    return masks


def _running_masks(pids: list[int]) -> list[list[set[int]]] | None:
    """Every process's thread masks, once all are past their pin (gRPC's threads exist)."""
    masks = [_masks(pid) for pid in pids]
    return masks if all(len(threads) > 1 for threads in masks) else None


@linux_affinity
def test_a_pinned_actor_runs_every_thread_on_its_cpu():
    cpu = max(os.sched_getaffinity(0))
    args = [sys.executable, "-m", "actors", "actor", "--learner", UNREACHABLE, "--cpu", str(cpu)]
    with running(args) as actor:
        pid = actor.popen.pid

        # gRPC's poller thread starts with the first channel, after the pin: it inherits it.
        def all_threads_pinned() -> bool:
            masks = _masks(pid)
            return len(masks) > 1 and all(mask == {cpu} for mask in masks)

        wait_until(all_threads_pinned, 30, what=f"every actor thread on CPU {cpu}")


@linux_affinity
@pytest.mark.parametrize("flags", [("--pin-cpus", "auto"), ()], ids=["auto", "default"])
def test_the_launcher_pins_one_actor_per_cpu_only_when_asked(flags):
    allowed = os.sched_getaffinity(0)
    n = len(allowed)  # a multiple of the CPUs: auto pins
    args = [
        sys.executable, "-m", "actors", "--learner", UNREACHABLE, "--num-actors", str(n),
        *flags,
    ]  # fmt: skip
    with running(args) as launcher:

        def all_started() -> list[int] | None:
            pids = child_pids(launcher.popen.pid)
            return pids if len(pids) == n else None

        children = wait_until(all_started, 30, what=f"{n} actor processes")
        masks = wait_until(lambda: _running_masks(children), 30, what="actors running")
    if not flags:  # off by default
        assert all(mask == allowed for threads in masks for mask in threads)
    else:
        cpus = [threads[0] for threads in masks]
        assert all(len(c) == 1 for c in cpus)
        assert set().union(*cpus) == allowed  # one actor on each CPU
