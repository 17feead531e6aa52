"""Where an actor host's actors run: how many per process, and which CPU each process gets."""

from __future__ import annotations

import os
from collections.abc import Sequence

PROCESSES_PER_CPU = 4
"""Auto ``--actors-per-process`` runs at most this many actor processes per CPU. Each
process's pages (interpreter, gRPC, its objects) compete for the caches and the TLB, so
beyond a few per CPU every round trip gets slower; threads share one set. Four per CPU
was the sweet spot of the measurements in docs/performance.md."""


def actor_process_sizes(num_actors: int, actors_per_process: int, cpus: int) -> list[int]:
    """How many actors each process of a launcher runs, in actor-index order.

    ``actors_per_process`` 0 is auto (:data:`PROCESSES_PER_CPU`). Actors are spread
    evenly, so sizes differ by at most one.
    """
    if actors_per_process > 0:
        processes = -(-num_actors // actors_per_process)
    else:
        processes = min(num_actors, PROCESSES_PER_CPU * max(1, cpus))
    base, extra = divmod(num_actors, processes)
    return [base + (p < extra) for p in range(processes)]


def usable_cpu_count() -> int:
    """How many CPUs this process may run on (all of them where affinity is unknown)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def actor_cpus(num_processes: int, pin: str, cpus: Sequence[int] | None = None) -> list[int]:
    """The CPU of each of the P actor processes one launcher starts (-1: any), by
    ``--pin-cpus``.

    Round robin over ``cpus`` (default: the CPUs this process may use). ``auto`` pins only
    when P is a multiple of them: then every CPU carries the same number of processes, and
    several such launchers on one host stay balanced; a lone replica on a bigger host
    (compose, Kubernetes) is left to the scheduler.
    """
    if cpus is None:
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not cpus or pin == "off" or (pin == "auto" and num_processes % len(cpus)):
        return [-1] * num_processes
    return [cpus[j % len(cpus)] for j in range(num_processes)]
