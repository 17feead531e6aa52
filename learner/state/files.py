"""Files of a run directory written whole: a temp file of the writer's own, fsynced, then
renamed over the old one (and the directory fsynced), so a kill at any moment leaves the
old file or the new one, and two writers (two learners on one volume are both pid 1 in
compose) never write into one temp file or sweep away each other's.

A rename waits on the writer's :class:`Lease` of the run directory (``failover.Fence``),
so a learner another has taken over from replaces nothing. The locks are ``flock``:
shared by every process on one kernel (containers on one host's volume included); on
NFS, Linux turns them into the server's byte-range locks, which hold only where the
server has locking on.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import BinaryIO, Protocol


class NotOwner(OSError):
    """A write refused at its rename: another learner owns the run directory now."""


class Lease(Protocol):
    """A writer's claim on a run directory, held across each rename into it."""

    def held(self) -> AbstractContextManager[None]:
        """Held while it lasts, so no other learner claims the directory meanwhile; raises
        :class:`NotOwner` when another learner already has."""
        ...


STALE_TEMP_S = 60.0
"""A temp file left this long and locked by no writer is a killed writer's: the age
covers the instant between creating a temp file and locking it."""


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str], lease: Lease | None = None) -> Iterator[BinaryIO]:
    """A private file to write ``path``'s new content into: on a clean exit it is fsynced
    and renamed over ``path`` (and the directory fsynced), on an error removed, so a kill
    at any moment leaves the old file or the new one.

    The temp file's name is unique (two learners on one volume can both be pid 1) and it
    is flock-ed while written, so another writer's sweep leaves it alone. With ``lease``
    the rename happens only while the lease holds (else :class:`NotOwner`, and ``path``
    stays as the leader wrote it).
    """
    target = Path(path)
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)  # 0600
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            # Never waits: a new file is locked by no one (a sweep takes only old ones).
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            yield f
            f.flush()
            os.fsync(f.fileno())
            with lease.held() if lease is not None else contextlib.nullcontext():
                os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_directory(target.parent)
    sweep_stale_temps(target)


def fsync_directory(path: Path) -> None:
    """Make a rename in ``path`` durable."""
    dir_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def sweep_stale_temps(target: Path, now: float | None = None) -> list[Path]:
    """Remove temp files of ``target`` that killed writers left (older than
    :data:`STALE_TEMP_S` and flock-ed by no one: a live writer holds its lock to the
    rename, and a lock dies with its process); the paths removed."""
    now = time.time() if now is None else now
    removed = []
    for stale in target.parent.glob(f".{target.name}.tmp-*"):
        try:
            if now - stale.stat().st_mtime < STALE_TEMP_S:
                continue
            with open(stale, "rb") as f:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                stale.unlink()  # under the lock: no writer can hold this file meanwhile
        except OSError:  # locked by a live writer, or gone already
            continue
        removed.append(stale)
    return removed
