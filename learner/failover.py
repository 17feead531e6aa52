"""Fail-over to a standby learner: who leads a run directory, and the standby's watch.

Two learners share one run directory (a shared disk or volume). The one serving writes
``leader.json`` (its run id and the address actors dial) when it starts. A standby
(``--standby ADDRESS``) watches that address's gRPC health; once the leader has answered
and then stayed silent for ``--standby-grace-s``, the standby resumes from the newest
checkpoint in the directory, serves, and writes ``leader.json`` in its turn. Actors
follow with ``--fallback-learner``. Two rules keep two learners from training into one
directory: a serving learner that finds ``leader.json`` naming another learner stops
without writing a checkpoint, and a learner started with ``--resume`` while the learner
``leader.json`` names still answers there (its run id, by GetInfo) becomes that
leader's standby, so a primary restarted in place (compose's ``restart: on-failure``)
waits instead of competing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc

from learner.serving.healthcheck import check
from learner.state.files import NotOwner
from seedrl.config import LearnerConfig
from seedrl.proto import seedrl_pb2 as pb
from seedrl.proto import seedrl_pb2_grpc as pb_grpc
from seedrl.security import config_auth_token
from seedrl.transport import WILDCARD_HOSTS, auth_metadata, client_channel, listen_address

log = logging.getLogger(__name__)

LEADER_FILE = "leader.json"
LOCK_FILE = ".leader.lock"
"""Held while leader.json changes and while the leader renames a file into the directory,
so a takeover cannot fall between a leader's last look at leader.json and its rename."""
RESULT_FILE = "result.json"
POLL_S = 0.5
"""Seconds between a standby's health checks of the leader."""
CHECK_TIMEOUT_S = 2.0
"""A health check that takes longer than this counts as no answer."""


@dataclasses.dataclass(frozen=True)
class Leader:
    """The learner serving a run directory: its run id and the address actors dial."""

    run_id: str
    address: str


def own_address(config: LearnerConfig) -> str:
    """The address a peer dials for this learner: --advertise-host, else --bind (a
    wildcard bind: this host's name)."""
    host = config.advertise_host or config.bind
    if host in WILDCARD_HOSTS:
        host = socket.gethostname()
    return listen_address(host, config.port)


def read_leader(logdir: str | os.PathLike[str]) -> Leader | None:
    """The leader ``leader.json`` names, or None when there is none (or it does not parse)."""
    try:
        data = json.loads((Path(logdir) / LEADER_FILE).read_text())
        return Leader(str(data["run_id"]), str(data["address"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


@contextlib.contextmanager
def directory_lock(logdir: str | os.PathLike[str]) -> Iterator[None]:
    """The run directory's lock (an exclusive ``flock`` of ``LOCK_FILE``), held briefly."""
    fd = os.open(Path(logdir) / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the lock


def write_leader(logdir: str | os.PathLike[str], leader: Leader) -> None:
    """Write ``leader.json`` atomically (a temp file of its own, renamed under the
    directory's lock): a reader sees one leader or the other, never half of one."""
    path = Path(logdir) / LEADER_FILE
    fd, name = tempfile.mkstemp(prefix=f".{LEADER_FILE}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(dataclasses.asdict(leader)) + "\n")
        with directory_lock(logdir):
            os.replace(name, path)
    finally:
        Path(name).unlink(missing_ok=True)


class Fence:
    """Tells a serving learner that another learner has taken over its run directory,
    and is the lease its checkpoint writes rename under (``files.Lease``)."""

    def __init__(self, logdir: str | os.PathLike[str], own: Leader) -> None:
        self.path = Path(logdir) / LEADER_FILE
        self.own = own
        self.lost = False
        """Superseded: write no checkpoint from now on (the directory is the other's)."""
        self.taken_by: Leader | None = None
        try:
            write_leader(logdir, own)
        except OSError as exc:  # a full disk: serve anyway, as with checkpoints
            log.error("could not write %s: %s", self.path, exc)
        self._seen = self._mtime()

    def _mtime(self) -> int:
        try:
            return self.path.stat().st_mtime_ns
        except OSError:
            return 0

    def _look(self) -> Leader | None:
        leader = read_leader(self.path.parent)
        if leader is not None and leader.run_id != self.own.run_id:
            self.lost, self.taken_by = True, leader
        return self.taken_by

    def superseded(self) -> Leader | None:
        """The learner that took over since we claimed the directory, else None."""
        if self.lost:
            return self.taken_by
        mtime = self._mtime()
        if mtime == self._seen:
            return None
        self._seen = mtime
        return self._look()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """The directory's lock while leader.json still names this learner (read afresh,
        not by mtime, whose granularity may hide a change); NotOwner once it names another."""
        with directory_lock(self.path.parent):
            other = self._look()
            if other is not None:
                raise NotOwner(f"the learner at {other.address} took over {self.path.parent}")
            yield


def finished_since(logdir: str | os.PathLike[str], since: float) -> bool:
    """Whether a learner ended the run for good (a final ``result.json``) after ``since``
    (wall clock): then there is nothing to take over."""
    path = Path(logdir) / RESULT_FILE
    try:
        if path.stat().st_mtime < since:
            return False
        return bool(json.loads(path.read_text()).get("final", True))
    except (OSError, ValueError, AttributeError):
        return False


HealthCheck = Callable[[str], tuple[bool, str]]


def health_check(config: LearnerConfig) -> HealthCheck:
    """Whether the learner at an address serves (and its status), the way --standby asks."""

    def ask(address: str) -> tuple[bool, str]:
        return check(address, "", CHECK_TIMEOUT_S, config.standby_tls_ca)

    return ask


Identify = Callable[[str], str | None]


def run_id_at(config: LearnerConfig) -> Identify:
    """The learner run id of whoever serves at an address (None: nobody answers), asked
    with GetInfo: a live leader is the one leader.json names, not any learner that took
    its port since."""

    def ask(address: str) -> str | None:
        channel = client_channel(address, config.standby_tls_ca)
        try:
            stub = pb_grpc.LearnerStub(channel)
            metadata = auth_metadata(config_auth_token(config))
            info = stub.GetInfo(pb.GetInfoRequest(), metadata=metadata, timeout=CHECK_TIMEOUT_S)
            return str(info.learner_run_id)
        except grpc.RpcError:
            return None
        finally:
            channel.close()

    return ask


def wait_to_lead(
    config: LearnerConfig,
    ask: HealthCheck,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Block while the leader at ``config.standby`` serves; True once it has served and then
    failed its health checks for ``standby_grace_s`` (take over), False when the run ended
    for good meanwhile (nothing to take over)."""
    started = time.time()
    seen_serving = False
    last_ok = clock()
    while True:
        ok, status = ask(config.standby)
        now = clock()
        if ok:
            if not seen_serving:
                print(f"seedrl standby: the leader at {config.standby} serves", flush=True)
            seen_serving, last_ok = True, now
        elif seen_serving and now - last_ok >= config.standby_grace_s:
            if finished_since(config.logdir, started):
                return False
            print(
                f"seedrl standby: the leader at {config.standby} stopped answering "
                f"({status}) {now - last_ok:.1f} s ago; taking over from {config.logdir}",
                flush=True,
            )
            return True
        sleep(POLL_S)


def standby_turn(
    config: LearnerConfig, ask: HealthCheck | None = None, identify: Identify | None = None
) -> LearnerConfig | None:
    """The config to serve with once it is this learner's turn, or None when the run ended
    while it waited.

    With ``--standby`` it waits for the leader to go; a ``--resume`` of a directory whose
    leader is another, live learner waits as that leader's standby. Serving after a
    wait resumes from the directory's newest checkpoint.
    """
    ask = ask or health_check(config)
    identify = identify or run_id_at(config)
    standby = config.standby
    if not standby and config.resume:
        leader = read_leader(config.logdir)
        elsewhere = leader is not None and leader.address != own_address(config)
        if elsewhere and leader is not None and identify(leader.address) == leader.run_id:
            standby = leader.address
    if not standby:
        return config
    config = dataclasses.replace(config, standby=standby)
    print(
        f"seedrl standby: watching the leader at {standby}; taking over from {config.logdir} "
        f"after {config.standby_grace_s:g} s without an answer",
        flush=True,
    )
    if not wait_to_lead(config, ask):
        print("seedrl standby: the run ended for good; nothing to take over", flush=True)
        return None
    return dataclasses.replace(config, standby="", resume=True)
