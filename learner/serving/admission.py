"""Admission: the stream limits (``--max-actors``, ``--max-envs``, ``--max-envs-per-peer``).

:class:`Admission` holds the rules once; where their counts live is its
:class:`AdmissionCounts`: this process's own for a one-process learner
(:class:`LocalCounts`), or a shared-memory block every serving-tier frontend reads and
writes under one cross-process lock (:class:`SharedCounts`), so N frontends admit exactly
what one process would. Counts move per stream (opened, admitted, ended), never per frame.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing import shared_memory
from pathlib import Path
from typing import Protocol

import numpy as np

from seedrl.config import LearnerConfig


class AdmissionCounts(Protocol):
    """Where admitted streams, streams awaiting their Hello and envs are counted."""

    def locked(self) -> contextlib.AbstractContextManager[None]:
        """Hold the counts still between a check and the change it allows."""
        ...

    def totals(self) -> tuple[int, int, int]:
        """(admitted streams, streams awaiting their Hello, envs in use), all holders'."""
        ...

    def peer_envs(self, host: str) -> int:
        """Envs in use by ``host``'s streams, all holders'."""
        ...

    def add(self, streams: int, awaiting: int, envs: int, host: str | None = None) -> None:
        """Move this holder's counts (``host``'s envs too, when given)."""
        ...


class Admission:
    """The stream limits, checked against ``counts``; each check returns None (room, now
    taken) or the refusal's message for RESOURCE_EXHAUSTED."""

    def __init__(self, config: LearnerConfig, counts: AdmissionCounts | None = None) -> None:
        self.max_actors = config.max_actors
        self.max_envs = config.max_envs
        self.envs_per_peer = config.envs_per_peer
        self.counts: AdmissionCounts = counts if counts is not None else LocalCounts()

    def open_stream(self) -> str | None:
        """A stream opened: it holds a --max-actors place until its Hello comes (so streams
        that never say who they are cannot pile up beside the admitted ones)."""
        with self.counts.locked():
            streams, waiting, _envs = self.counts.totals()
            if streams + waiting >= self.max_actors:
                return (
                    f"learner is full: {streams} actors connected and {waiting} streams "
                    f"awaiting their Hello, --max-actors {self.max_actors}; retry later"
                )
            self.counts.add(0, 1, 0)
        return None

    def hello_ended(self) -> None:
        """The stream's wait for its Hello is over (it came, or the stream ended)."""
        with self.counts.locked():
            self.counts.add(0, -1, 0)

    def admit(self, host: str, rows: int) -> str | None:
        """A stream that said Hello, from peer ``host`` with ``rows`` env rows."""
        with self.counts.locked():
            streams, _waiting, envs = self.counts.totals()
            if streams >= self.max_actors:
                return (
                    f"learner is full: {streams} actors connected, --max-actors "
                    f"{self.max_actors}; retry later"
                )
            if envs + rows > self.max_envs:
                return (
                    f"learner is full: {envs} envs in use + {rows} asked exceeds "
                    f"--max-envs {self.max_envs}; retry later"
                )
            peer_envs = self.counts.peer_envs(host)
            if peer_envs + rows > self.envs_per_peer:
                return (
                    f"peer {host} holds {peer_envs} envs + {rows} asked exceeds "
                    f"--max-envs-per-peer {self.envs_per_peer}; retry later"
                )
            self.counts.add(1, 0, rows, host)
        return None

    def leave(self, host: str, rows: int) -> None:
        """An admitted stream ended: its place and its envs are free."""
        with self.counts.locked():
            self.counts.add(-1, 0, -rows, host)


class LocalCounts:
    """One process's counts (the event loop is the only writer: no lock needed)."""

    def __init__(self) -> None:
        self.streams = self.awaiting = self.envs = 0
        self.by_peer: dict[str, int] = {}

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        yield

    def totals(self) -> tuple[int, int, int]:
        return self.streams, self.awaiting, self.envs

    def peer_envs(self, host: str) -> int:
        return self.by_peer.get(host, 0)

    def add(self, streams: int, awaiting: int, envs: int, host: str | None = None) -> None:
        self.streams += streams
        self.awaiting += awaiting
        self.envs += envs
        if host is not None:
            left = self.by_peer.get(host, 0) + envs
            if left:
                self.by_peer[host] = left
            else:
                self.by_peer.pop(host, None)


@dataclass(frozen=True)
class CountsSpec:
    """The shape and name of one shared admission block (pickled to each frontend)."""

    holders: int
    """Frontends, each with its own column of counts (a dead one's column is zeroed)."""
    peers: int
    """Peer entries: at most one per admitted stream, so ``--max-actors`` of them."""
    name: str
    lock_path: str
    """The file whose ``flock`` is the lock: the kernel drops it with a process that dies
    holding it, where a semaphore would stay taken."""


class SharedCounts:
    """Counts in a shared-memory block: per holder (frontend) streams, awaiting and envs,
    and a peer table of (key, envs per holder). The totals are sums over the holders, so a
    dead holder's share goes with :meth:`forget`. Open it as ``holder`` (a frontend's
    index) to move counts; the creator (the model process) reads and forgets."""

    def __init__(self, spec: CountsSpec, holder: int = -1, create: bool = False) -> None:
        self.spec = spec
        self.holder = holder
        h, p = spec.holders, spec.peers
        size = 8 * (3 * h + p + p * h)
        self.shm = shared_memory.SharedMemory(name=spec.name, create=create, size=size)
        self.owner = create
        buf = self.shm.buf
        assert buf is not None
        counts = np.frombuffer(buf, np.int64, size // 8)
        self.counts_3H = counts[: 3 * h].reshape(3, h)
        """Rows: admitted streams, streams awaiting their Hello, envs in use."""
        self.peer_key_P = counts[3 * h : 3 * h + p]
        """A peer's key (0: a free entry)."""
        self.peer_envs_PH = counts[3 * h + p :].reshape(p, h)
        if create:
            counts[:] = 0
        self._lock_fd = os.open(spec.lock_path, os.O_RDWR | os.O_CREAT, 0o600)

    @classmethod
    def create(cls, holders: int, peers: int, lock_dir: Path) -> SharedCounts:
        name = f"seedrl-adm-{os.getpid()}-{os.urandom(4).hex()}"
        lock_path = str(lock_dir / f"{name}.lock")
        return cls(CountsSpec(holders, max(1, peers), name, lock_path), create=True)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def totals(self) -> tuple[int, int, int]:
        streams, awaiting, envs = self.counts_3H.sum(axis=1).tolist()
        return streams, awaiting, envs

    def peer_envs(self, host: str) -> int:
        found = np.flatnonzero(self.peer_key_P == _peer_key(host))
        return int(self.peer_envs_PH[found[0]].sum()) if len(found) else 0

    def add(self, streams: int, awaiting: int, envs: int, host: str | None = None) -> None:
        self.counts_3H[:, self.holder] += (streams, awaiting, envs)
        if host is None:
            return
        key = _peer_key(host)
        found = np.flatnonzero(self.peer_key_P == key)
        if len(found):
            entry = int(found[0])
        else:  # a peer new to every holder takes a free entry (one per admitted stream)
            entry = int(np.flatnonzero(self.peer_key_P == 0)[0])
            self.peer_key_P[entry] = key
        self.peer_envs_PH[entry, self.holder] += envs
        if not self.peer_envs_PH[entry].any():
            self.peer_key_P[entry] = 0

    def forget(self, holder: int) -> None:
        """A dead holder's streams and envs are gone: its column goes to zero."""
        with self.locked():
            self.counts_3H[:, holder] = 0
            self.peer_envs_PH[:, holder] = 0
            self.peer_key_P[~self.peer_envs_PH.any(axis=1)] = 0

    def close(self) -> None:
        del self.counts_3H, self.peer_key_P, self.peer_envs_PH
        self.shm.close()
        os.close(self._lock_fd)
        if self.owner:
            with contextlib.suppress(FileNotFoundError):
                self.shm.unlink()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.spec.lock_path)


def _peer_key(host: str) -> int:
    """A peer's key in the shared table, the same in every process (``hash`` is not), and
    never 0 (a free entry)."""
    key = int.from_bytes(hashlib.blake2b(host.encode(), digest_size=8).digest(), "little")
    return (key >> 1) or 1  # fits int64, not 0
