"""The soak's cluster on this host: learner places, actor launchers, an actor host behind
a link the soak can cut, a run directory on a disk it can fill, and the processes' RSS.

Every process is started in its own session (so a kill takes its children too) with its
output in a log file under the soak's work directory; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from learner.serving.slots import PROCESS_NAME as FRONTEND_NAME

ROOT = Path(__file__).resolve().parents[2]
CMD_TIMEOUT_S = 10.0


class Proc:
    """A child process in its own session, its output going to ``log``."""

    def __init__(self, args: Sequence[str], log: Path, env: dict[str, str]) -> None:
        self.args = list(args)
        self.log = log
        self._out = open(log, "ab")  # noqa: SIM115  (closed in stop)
        self.popen = subprocess.Popen(
            self.args, cwd=ROOT, env=env, stdout=self._out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        self.pid = self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the whole session (a learner and its trainer: a host that dies)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def stop(self, grace: float = 15.0) -> int | None:
        """SIGTERM, wait up to ``grace``, then SIGKILL what is left of the session."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(grace)
        self.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)
        self._out.close()
        return self.popen.returncode


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc; empty when it is gone)."""
    kids: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids.extend(int(p) for p in f.read().split())
    return kids


def descendants(pid: int) -> list[int]:
    out, todo = [], children(pid)
    while todo:
        child = todo.pop()
        out.append(child)
        todo.extend(children(child))
    return out


def rss_mb(pid: int) -> float:
    """Resident set size of ``pid`` in MB (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def trainer_pid(learner_pid: int) -> int | None:
    """The trainer process a learner spawned (multiprocessing's spawn child, not its
    resource tracker nor a serving frontend)."""
    for pid in children(learner_pid):
        line = cmdline(pid)
        spawned = "multiprocessing" in line and "resource_tracker" not in line
        if spawned and not comm(pid).startswith(FRONTEND_NAME):
            return pid
    return None


def frontend_pids(learner_pid: int) -> dict[int, int]:
    """The serving frontends a learner spawned (``--serving-processes``): index -> pid,
    by the process name each gives itself."""
    found = {}
    for pid in children(learner_pid):
        name = comm(pid)
        if name.startswith(FRONTEND_NAME) and name[len(FRONTEND_NAME) :].isdigit():
            found[int(name[len(FRONTEND_NAME) :])] = pid
    return found


def comm(pid: int) -> str:
    """A process's name (``/proc/PID/comm``; empty when it is gone)."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


# ---------------------------------------------------------------- the actor host


def ip(*args: str) -> None:
    run_cmd(["ip", *args])


def run_cmd(args: Sequence[str]) -> None:
    done = subprocess.run(
        list(args), capture_output=True, text=True, timeout=CMD_TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {done.stderr.strip()}")


NETEM = ("netem", "loss", "20%", "delay", "100ms", "50ms")
"""A lossy, slow link: a fifth of the packets lost, 100 ms +- 50 ms each way."""


@dataclasses.dataclass
class ActorHost:
    """A network namespace joined to this host by a veth pair: actors there reach the
    learner only over that link, which :meth:`cut` pulls or makes lossy."""

    netns: str
    veth_host: str
    veth_ns: str
    host_address: str
    ns_address: str
    netem: str = ""
    """Why ``tc netem`` cannot shape the link here ("" when it can): then every cut is a
    pulled link."""

    @classmethod
    def make(cls) -> ActorHost | str:
        """The namespace, or the reason it cannot be made here."""
        if os.geteuid() != 0:
            return "network namespaces need root"
        for tool in ("ip", "tc"):
            if shutil.which(tool) is None:
                return f"'{tool}' (iproute2) is not installed"
        tag = uuid.uuid4().hex[:6]
        block = random.randrange(0, 2**14) * 4  # a /30 of 10.201.0.0/16
        base = f"10.201.{block // 256}"
        host = cls(
            f"seedrl-soak-{tag}", f"soak{tag}h", f"soak{tag}n",
            f"{base}.{block % 256 + 1}", f"{base}.{block % 256 + 2}",
        )  # fmt: skip
        try:
            ip("netns", "add", host.netns)
            ip("link", "add", host.veth_host, "type", "veth", "peer", "name", host.veth_ns)
            ip("link", "set", host.veth_ns, "netns", host.netns)
            ip("addr", "add", f"{host.host_address}/30", "dev", host.veth_host)
            ip("link", "set", host.veth_host, "up")
            ip("-n", host.netns, "addr", "add", f"{host.ns_address}/30", "dev", host.veth_ns)
            ip("-n", host.netns, "link", "set", "lo", "up")
            ip("-n", host.netns, "link", "set", host.veth_ns, "up")
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            host.close()
            return f"cannot build a network namespace: {exc}"
        try:  # the kernel may lack sch_netem (containers without the module)
            run_cmd(["tc", "qdisc", "add", "dev", host.veth_host, "root", *NETEM])
            run_cmd(["tc", "qdisc", "del", "dev", host.veth_host, "root"])
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            host.netem = str(exc)
        return host

    def command(self, args: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *args]

    def cut(self, mode: str) -> None:
        """``down``: the link pulled; ``netem``: loss and delay both ways."""
        if mode == "down":
            ip("-n", self.netns, "link", "set", self.veth_ns, "down")
            return
        run_cmd(["tc", "qdisc", "add", "dev", self.veth_host, "root", *NETEM])
        run_cmd(self.command(["tc", "qdisc", "add", "dev", self.veth_ns, "root", *NETEM]))

    def heal(self, mode: str) -> None:
        if mode == "down":
            ip("-n", self.netns, "link", "set", self.veth_ns, "up")
            return
        with contextlib.suppress(RuntimeError):
            run_cmd(["tc", "qdisc", "del", "dev", self.veth_host, "root"])
        with contextlib.suppress(RuntimeError):
            run_cmd(self.command(["tc", "qdisc", "del", "dev", self.veth_ns, "root"]))

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, OSError, subprocess.TimeoutExpired):
            ip("netns", "del", self.netns)  # takes its end of the veth pair, and so both
        with contextlib.suppress(RuntimeError, OSError, subprocess.TimeoutExpired):
            ip("link", "del", self.veth_host)


# ---------------------------------------------------------------- the run directory's disk


def mount_tmpfs(path: Path, size_mb: int) -> str | None:
    """Mount a tmpfs of ``size_mb`` at ``path``; None once mounted, else the reason not."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    try:
        run_cmd(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0700", "tmpfs", str(path)])
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot mount a tmpfs: {exc}"
    return None


def unmount(path: Path) -> None:
    with contextlib.suppress(RuntimeError, OSError, subprocess.TimeoutExpired):
        run_cmd(["umount", "-l", str(path)])


def fill_disk(directory: Path) -> Path:
    """Fill the filesystem of ``directory`` to the last block with one file; returns it."""
    filler = directory / "soak-filler.bin"
    chunk = 1 << 20
    with open(filler, "wb", buffering=0) as f:
        while chunk >= 512:
            try:
                f.write(b"\0" * chunk)
            except OSError:
                chunk //= 4
    return filler


def free_bytes(directory: Path) -> int:
    stat = os.statvfs(directory)
    return stat.f_bavail * stat.f_frsize


# ---------------------------------------------------------------- connection flood


class IdleFlood:
    """``count`` TCP connections to a learner on this host that send nothing, as a stranger
    without the token could open: how many the server has closed is :meth:`poll`'s count."""

    def __init__(self, place: str, count: int) -> None:
        host, port = place.rsplit(":", 1)
        if not is_local_address(host):
            raise RuntimeError(f"the flood stays on this host; {host} is not one of its addresses")
        self.selector = selectors.DefaultSelector()
        self.socks: list[socket.socket] = []
        try:
            for _ in range(count):
                sock = socket.create_connection((host, int(port)), timeout=5)
                sock.setblocking(False)
                self.socks.append(sock)
                self.selector.register(sock, selectors.EVENT_READ)
        except OSError:
            self.close()
            raise
        self.closed = 0
        """Connections the server has closed (EOF or reset)."""

    def poll(self, timeout: float) -> int:
        """Wait ``timeout`` s (less once the server closes more); the count closed so far."""
        if self.closed == len(self.socks):
            time.sleep(timeout)  # nothing left to wait on: the caller's pace stays the same
        else:
            for key, _ in self.selector.select(timeout):
                try:
                    data = key.fileobj.recv(4096)  # type: ignore[union-attr]
                except OSError:
                    data = b""
                if not data:  # bytes the server sends first are read past
                    self.selector.unregister(key.fileobj)
                    self.closed += 1
        return self.closed

    def close(self) -> None:
        self.selector.close()
        for sock in self.socks:
            sock.close()


def is_local_address(host: str) -> bool:
    """Whether ``host`` is loopback or an address of this host (the soak's veth side)."""
    if host.startswith("127.") or host in ("localhost", "::1"):
        return True
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind((host, 0))  # only an address of this host can be bound
    except OSError:
        return False
    return True


# ---------------------------------------------------------------- metrics and RSS


class MetricsTail:
    """The records a run directory's metrics.jsonl gains, read incrementally."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: list[dict[str, Any]] = []
        self._offset = 0
        self._lock = threading.Lock()

    def poll(self) -> list[dict[str, Any]]:
        with self._lock:
            try:
                with open(self.path, "rb") as f:
                    f.seek(self._offset)
                    data = f.read()
            except OSError:
                return self.records
            end = data.rfind(b"\n") + 1  # a line still being written waits for next time
            for line in data[:end].splitlines():
                with contextlib.suppress(ValueError):
                    self.records.append(json.loads(line))
            self._offset += end
            return self.records

    def last(self) -> dict[str, Any]:
        records = self.poll()
        return records[-1] if records else {}

    def since(self, wall: float) -> list[dict[str, Any]]:
        return [r for r in self.poll() if r.get("time", 0) >= wall]


class RssSampler(threading.Thread):
    """Every ``interval_s``: the RSS of the serving learner (and its trainer), and of every
    actor process, kept as a time series."""

    def __init__(self, soak: Any, interval_s: float) -> None:
        super().__init__(name="rss", daemon=True)
        self.soak = soak
        self.interval_s = interval_s
        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()

    def run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.samples.append(self.sample())

    def sample(self) -> dict[str, float]:
        leader = self.soak.leader_proc
        learner = trainer = 0.0
        if leader is not None and leader.alive():
            learner = rss_mb(leader.pid)
            trainer = sum(rss_mb(p) for p in descendants(leader.pid))
        actor_rss = [
            rss_mb(pid)
            for launcher in self.soak.launchers
            for pid in [launcher.pid, *descendants(launcher.pid)]
        ]
        actor_rss = [r for r in actor_rss if r > 0]
        return {
            "t": time.monotonic() - self.soak.started,
            "learner_mb": learner,
            "trainer_mb": trainer,
            "learner_total_mb": learner + trainer,
            "actors_mb": sum(actor_rss),
            "actor_max_mb": max(actor_rss, default=0.0),
            "actor_processes": len(actor_rss),
        }

    def stop(self) -> None:
        self._stop.set()


def python() -> str:
    return sys.executable
