"""``--serving-processes auto``: how many serving frontends this host runs.

A frontend takes the per-message work off the model process at the cost of a hop per
frame and a process per frontend; on a host with few cores that hop costs more than the
spread gives (docs/serving-tier.md), so auto serves in one process there. Elsewhere it
leaves two cores to the model process and the trainer and gives a frontend to every two
of the rest, up to :data:`MAX_FRONTENDS`. Auto never turns the tier on for a run the
tier would refuse (a unix path too long for the frontends' sockets beside it): such a
run serves in one process, while an explicit N keeps its one-line refusal
(:func:`learner.serving.tier.check_tier_supported`); nor for a run whose slot table,
reply rows and rings would not fit the free shared memory (a container's default
/dev/shm is small), where an explicit N says so in one line.

Light on purpose (no torch, no gRPC): the learner resolves its config with it before it
builds the serving side.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from seedrl.config import LearnerConfig
from seedrl.proto import seedrl_pb2 as pb
from seedrl.transport import UNIX_PATH_MAX, frontend_bind_address

log = logging.getLogger(__name__)

FLAG = "--serving-processes"
SHM_DIR = "/dev/shm"
MIN_CORES = 4
"""Below this many usable cores auto serves in one process."""
RESERVED_CORES = 2
"""Cores auto leaves to the model process and the trainer."""
CORES_PER_FRONTEND = 2
MAX_FRONTENDS = 8


def usable_cores() -> int:
    """Cores this process may run on (its affinity, which a container's cpuset narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity call on this platform
        return os.cpu_count() or 1


def frontends_for_cores(cores: int) -> int:
    """What auto picks on a host with ``cores`` usable cores, for a run the tier serves."""
    if cores < MIN_CORES:
        return 0
    return min((cores - RESERVED_CORES) // CORES_PER_FRONTEND, MAX_FRONTENDS)


def shm_room(path: str = SHM_DIR) -> int | None:
    """Free bytes of the shared-memory filesystem; None where there is none to ask."""
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def tier_gaps(config: LearnerConfig, env_spec: pb.EnvSpec) -> list[str]:
    """What this run asks for that the serving tier does not carry (empty: none)."""
    missing = []
    if config.bind.startswith("unix:"):
        # The last frontend's socket beside the path has the longest name of them.
        last = (config.serving_frontends or MAX_FRONTENDS) - 1
        beside = frontend_bind_address(config.bind, last).removeprefix("unix:")
        if len(os.fsencode(beside)) > UNIX_PATH_MAX:
            missing.append(
                f"a unix --bind whose frontend sockets beside it exceed {UNIX_PATH_MAX} "
                f"bytes ({beside})"
            )
    return missing


def resolve_serving(
    config: LearnerConfig,
    env_spec: pb.EnvSpec,
    cores: int | None = None,
    shared_bytes: Callable[[int], int] | None = None,
    room: int | None = None,
) -> LearnerConfig:
    """``config`` with ``--serving-processes`` a number: an explicit one as given, auto
    from ``cores`` (default: this process's usable cores) and what the run needs.

    ``shared_bytes(n)``: the shared memory n frontends would take, checked against
    ``room`` (default: what /dev/shm has free)."""
    if config.serving_frontends is not None:
        return config
    if tier_gaps(config, env_spec):
        count = 0
    else:
        count = frontends_for_cores(usable_cores() if cores is None else cores)
    if count and shared_bytes is not None:
        needed, free = shared_bytes(count), shm_room() if room is None else room
        if free is not None and needed > free:
            log.warning(
                "%s auto serves in this process: %d frontends' %d MiB of shared memory exceed "
                "the %d MiB free in %s", FLAG, count, needed >> 20, free >> 20, SHM_DIR,
            )  # fmt: skip
            count = 0
    return config.with_changes(serving_processes=str(count))


def frontends(config: LearnerConfig) -> int:
    """The number of frontends of a resolved config (:func:`resolve_serving` first)."""
    count = config.serving_frontends
    if count is None:
        raise ValueError(f"{FLAG} auto is resolved before the learner serves")
    return count
