"""Two Linux network namespaces joined by a veth pair: a tiny two-host network for tests.

Each namespace has its own loopback, interfaces and routes, so a learner in one and
actors in the other talk over a real (virtual) link that the test can cut. The /30
subnet exists only inside the two namespaces; everything is deleted on exit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Sequence

IP_TIMEOUT_S = 10.0


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no iproute2, no privileges)."""


def ip(*args: str) -> None:
    """Run ``ip ARGS``; raise with its stderr on failure."""
    done = subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")


@dataclasses.dataclass(frozen=True)
class Host:
    """One namespace: its name, its end of the veth pair and its address on the link."""

    netns: str
    veth: str
    address: str

    def command(self, args: Sequence[str]) -> list[str]:
        """``args`` run inside this namespace."""
        return ["ip", "netns", "exec", self.netns, *args]


@dataclasses.dataclass(frozen=True)
class TwoHosts:
    left: Host
    right: Host

    def set_link(self, up: bool) -> None:
        """Bring the right host's end of the link down (cable pulled) or up again."""
        ip("-n", self.right.netns, "link", "set", self.right.veth, "up" if up else "down")


def check_available() -> None:
    """Raise :class:`NetnsUnavailable` with the reason when namespaces cannot be made."""
    if os.geteuid() != 0:
        raise NetnsUnavailable("network namespaces need root")
    if shutil.which("ip") is None:
        raise NetnsUnavailable("iproute2 ('ip') is not installed")
    probe = f"seedrl-probe-{uuid.uuid4().hex[:8]}"
    try:
        ip("netns", "add", probe)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        raise NetnsUnavailable(f"cannot create a network namespace: {exc}") from exc
    ip("netns", "del", probe)


@contextlib.contextmanager
def two_hosts() -> Iterator[TwoHosts]:
    """Two fresh namespaces on a private /30 joined by a veth pair; deleted on exit."""
    check_available()
    tag = uuid.uuid4().hex[:6]
    # 10.200.0.0/16 carved into /30s; a random one, only ever routed inside the namespaces.
    block = random.randrange(0, 2**14) * 4
    prefix = f"10.200.{block // 256}.{block % 256}"
    base = prefix.rsplit(".", 1)[0]
    last = int(prefix.rsplit(".", 1)[1])
    left = Host(f"seedrl-l-{tag}", f"srl{tag}a", f"{base}.{last + 1}")
    right = Host(f"seedrl-r-{tag}", f"srl{tag}b", f"{base}.{last + 2}")
    made: list[str] = []
    try:
        for host in (left, right):
            ip("netns", "add", host.netns)
            made.append(host.netns)
        ip("link", "add", left.veth, "type", "veth", "peer", "name", right.veth)
        for host in (left, right):
            ip("link", "set", host.veth, "netns", host.netns)
            ip("-n", host.netns, "addr", "add", f"{host.address}/30", "dev", host.veth)
            ip("-n", host.netns, "link", "set", "lo", "up")
            ip("-n", host.netns, "link", "set", host.veth, "up")
        yield TwoHosts(left, right)
    finally:
        for name in made:  # deleting a namespace deletes its end of the veth pair (and so both)
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                ip("netns", "del", name)
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            ip("link", "del", left.veth)  # only there if the move into a namespace failed
