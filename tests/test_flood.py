"""Connections and streams that never say who they are, against a real learner process.

The learner runs with a lowered open-file limit (the hard limit it may raise its soft one
to), so a bounded flood of idle loopback sockets, more than it may serve at once, would
take every descriptor it has. It must close them (at once past --max-connections' cap, the
rest at --handshake-timeout-s), keep answering health checks and GetInfo, and keep writing
checkpoints. Streams that send no Hello hold --max-actors places until
--hello-timeout-s, and one peer holds at most --max-envs-per-peer envs.
"""

from __future__ import annotations

import contextlib
import resource
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support import learner_process, wait_until
from wire_clients import HeldStream, act, get_info, hello, stub

from learner.serving.server import connection_cap, connection_limits
from learner.serving.servicer import peer_host
from seedrl.config import LearnerConfig

SOFT_FILES, HARD_FILES = 200, 256
"""The learner's open-file limits as started; it raises the soft one to the hard one."""
FLOOD = 300
"""Idle sockets opened at once: more than the descriptors the learner may serve them on."""
PREFACED = 20
"""Sockets that begin HTTP/2 and then start no call (closed by the connection idle bound)."""
HANDSHAKE_S, CONNECTION_IDLE_S, HELLO_S = 2.0, 3.0, 3.0
MAX_ACTORS, MAX_ENVS = 3, 16
CLOSE_WAIT_S = 10.0
"""How long the test waits for the server to close the flood: well past the bounds above,
and short of the keepalive's (a ping every 10 s, unanswered for 5 s), which without them
is what closes a socket that sends nothing, once it is accepted at all."""
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
"""The client connection preface and an empty SETTINGS frame (RFC 9113, section 3.4)."""


def _lowered_file_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (SOFT_FILES, HARD_FILES))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, int, Path]]:
    logdir = tmp_path_factory.mktemp("flood")
    extra = [
        "--handshake-timeout-s", str(HANDSHAKE_S),
        "--connection-idle-timeout-s", str(CONNECTION_IDLE_S),
        "--hello-timeout-s", str(HELLO_S),
        "--max-actors", str(MAX_ACTORS), "--max-envs", str(MAX_ENVS),
        "--checkpoint-interval-s", "1",
    ]  # fmt: skip
    with learner_process(logdir, *extra, preexec_fn=_lowered_file_limit) as (learner, port):
        yield learner, port, logdir
        assert learner.popen.poll() is None, learner.output()
        assert "Too many open files" not in learner.output(), learner.output()


def _open_files_limits(pid: int) -> tuple[int, int]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no open-file limit in /proc")


def test_the_learner_raises_its_soft_open_file_limit(served):
    learner, _port, _logdir = served
    assert _open_files_limits(learner.popen.pid) == (HARD_FILES, HARD_FILES)


def test_the_connection_cap_stays_under_half_the_open_file_limit():
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert connection_cap(10 * soft) == soft // 2
    assert connection_cap(3) == 3
    options = dict(connection_limits(LearnerConfig(max_connections=3, handshake_timeout_s=1.5)))
    assert options["grpc.max_allowed_incoming_connections"] == 3
    assert options["grpc.server_handshake_timeout_ms"] == 1500
    assert options["grpc.max_connection_idle_ms"] == 60_000
    off = dict(connection_limits(LearnerConfig(connection_idle_timeout_s=0)))
    assert "grpc.max_connection_idle_ms" not in off


def _health(port: int) -> str:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=2
            )
        except grpc.RpcError as exc:
            return exc.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


@contextlib.contextmanager
def _flood(port: int, count: int, preface: bytes = b"") -> Iterator[list[socket.socket]]:
    """``count`` loopback sockets to the learner that send ``preface`` and then nothing."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            if preface:
                sock.sendall(preface)
            sock.setblocking(False)
            socks.append(sock)
        yield socks
    finally:
        for sock in socks:
            sock.close()


def _wait_all_closed_by_server(socks: list[socket.socket], timeout: float) -> None:
    """Return once the server has closed every socket (EOF or reset); fail after
    ``timeout``. Bytes the server sends first (its SETTINGS, a GOAWAY) are read past."""
    selector = selectors.DefaultSelector()
    for sock in socks:
        selector.register(sock, selectors.EVENT_READ)
    open_left, deadline = len(socks), time.monotonic() + timeout
    while open_left and time.monotonic() < deadline:
        for key, _ in selector.select(0.2):
            try:
                data = key.fileobj.recv(4096)  # type: ignore[union-attr]
            except OSError:
                data = b""
            if not data:
                selector.unregister(key.fileobj)
                open_left -= 1
    selector.close()
    assert not open_left, f"{open_left} of {len(socks)} idle connections still open"


def test_an_idle_connection_flood_is_closed_and_health_and_checkpoints_go_on(served):
    _learner, port, logdir = served
    checkpoint = logdir / "checkpoint.pt"
    wait_until(checkpoint.exists, 30, what="a first checkpoint")
    # The prefaced ones first, within the cap: the rest of the flood is over it.
    with _flood(port, PREFACED, HTTP2_PREFACE) as prefaced, _flood(port, FLOOD) as silent:
        flood_began = checkpoint.stat().st_mtime
        # Every one is closed by the server while this side still holds it open.
        _wait_all_closed_by_server(silent + prefaced, CLOSE_WAIT_S)
        assert _health(port) == "SERVING"
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            assert get_info(channel).env.env_id == "CartPole-v1"
        wait_until(
            lambda: checkpoint.stat().st_mtime > flood_began, 30, what="a checkpoint in the flood"
        )


def _silent_stream(channel: grpc.Channel, release: threading.Event) -> grpc.Future:
    def nothing() -> Iterator[bytes]:
        release.wait(30)
        yield from ()

    return stub(channel).Act(nothing(), timeout=30)  # type: ignore[no-any-return]


def test_streams_awaiting_their_hello_hold_places_until_their_bound(served):
    _learner, port, _logdir = served
    release = threading.Event()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        env = get_info(channel).env
        silent = [_silent_stream(channel, release) for _ in range(MAX_ACTORS)]
        try:
            # Once their handlers run, the silent streams fill --max-actors.
            refused = wait_until(
                lambda: (
                    (o := act(channel, [hello(env, 1)])).code == grpc.StatusCode.RESOURCE_EXHAUSTED
                    and o
                ),
                10,
                what="a Hello refused beside streams awaiting theirs",
            )
            assert "3 streams awaiting their Hello, --max-actors 3" in refused.details
            for call in silent:  # each ends at its bound, with a status that says why
                assert call.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                assert f"no Hello within {HELLO_S:g} s" in call.details()
        finally:
            release.set()
        # Their places are free again.
        outcome = act(channel, [hello(env, 1)])
        assert outcome.code == grpc.StatusCode.OK, outcome
        assert outcome.replies[0].WhichOneof("kind") == "accept"


def test_one_peer_cannot_take_every_env_slot(served):
    _learner, port, _logdir = served
    quota = MAX_ENVS // 2
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        info = get_info(channel)
        held = HeldStream(channel, info.env, num_envs=quota)
        try:
            outcome = act(channel, [hello(info.env, 1)])
            assert outcome.code == grpc.StatusCode.RESOURCE_EXHAUSTED, outcome
            assert f"holds {quota} envs + 1 asked exceeds --max-envs-per-peer {quota}" in (
                outcome.details
            )
            # Another peer (this host's actors on the unix socket) gets the other half.
            assert info.local_address.startswith("unix:")
            with grpc.insecure_channel(info.local_address) as local:
                other = act(local, [hello(info.env, quota)])
            assert other.code == grpc.StatusCode.OK, other
            assert other.replies[0].WhichOneof("kind") == "accept"
        finally:
            held.close()


def test_a_peer_is_its_address_without_the_port():
    assert peer_host("ipv4:10.0.0.7:51234") == peer_host("ipv4:10.0.0.7:40000") == "ipv4:10.0.0.7"
    assert peer_host("ipv6:[::1]:51234") == "ipv6:[::1]"
    assert peer_host("ipv6:%5B::1%5D:51234") == "ipv6:%5B::1%5D"
    assert peer_host("unix:/tmp/x/learner.sock") == peer_host("unix:") == "unix"
    assert LearnerConfig(max_envs=16).envs_per_peer == 8
    assert LearnerConfig(max_envs=16, max_envs_per_peer=16).envs_per_peer == 16
