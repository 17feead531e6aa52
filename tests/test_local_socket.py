"""Same-host actors switch to the learner's unix socket; anything else stays on TCP."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import subprocess
import sys

import grpc
import pytest
from support import actor_args, actors_reach_every_frontend, learner_process, running
from wire_clients import get_info

from actors.actor import Actor
from benchmarks.echo import echo_servicer
from seedrl.config import ActorConfig, LearnerConfig
from seedrl.transport import (
    LOCAL_SOCKET_NAME,
    LocalSocket,
    add_learner_service,
    frontend_local_address,
    is_loopback,
    local_target,
    remove_stale_local_sockets,
)

INFO = {"SEEDRL_LOG_LEVEL": "INFO"}


@pytest.mark.parametrize(
    ("target", "loopback"),
    [
        ("127.0.0.1:8686", True),
        ("127.1.2.3:1", True),
        ("localhost:8686", True),
        ("[::1]:8686", True),
        ("10.0.0.5:8686", False),
        ("learner:8686", False),
        ("[2001:db8::1]:8686", False),
        ("unix:/tmp/x.sock", False),
    ],
)
def test_is_loopback(target: str, loopback: bool) -> None:
    assert is_loopback(target) is loopback


def test_local_target_needs_a_loopback_dial_and_a_visible_socket(tmp_path) -> None:
    path = tmp_path / "learner.sock"
    offered = f"unix:{path}"
    assert local_target(offered, "127.0.0.1:8686") is None  # no such file (other container)
    path.touch()
    assert local_target(offered, "127.0.0.1:8686") == offered
    assert local_target(offered, "10.0.0.5:8686") is None  # the learner is elsewhere
    assert local_target("", "127.0.0.1:8686") is None  # not offered
    assert local_target("ipv4:127.0.0.1:9", "127.0.0.1:8686") is None
    # A unix dial is on this host too: a serving frontend's own socket beside the bound path.
    assert local_target(offered, "unix:/run/seedrl/learner.sock") == offered
    assert local_target(offered, offered) is None  # already there


def test_local_socket_directory_is_private_and_removed() -> None:
    local = LocalSocket()
    assert local.address.startswith("unix:")
    mode = stat.S_IMODE(os.stat(local.directory).st_mode)
    assert mode == 0o700
    local.remove()
    assert not os.path.exists(local.directory)


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    return child.pid


def test_local_socket_directory_names_its_owner_pid() -> None:
    local = LocalSocket()
    try:
        assert os.path.basename(local.directory).startswith(f"seedrl-{os.getpid()}-")
    finally:
        local.remove()


def test_stale_socket_directories_of_dead_learners_are_removed(tmp_path) -> None:
    dead = _dead_pid()
    stale_with_file = tmp_path / f"seedrl-{dead}-abcd"
    stale_with_file.mkdir()
    (stale_with_file / LOCAL_SOCKET_NAME).touch()  # a socket file nobody listens on
    stale_empty = tmp_path / f"seedrl-{dead}-efgh"
    stale_empty.mkdir()
    live = tmp_path / f"seedrl-{os.getpid()}-ijkl"
    live.mkdir()
    other = tmp_path / f"other-{dead}-mnop"
    other.mkdir()
    old_style = tmp_path / "seedrl-qrst"  # no pid in the name: not ours to judge
    old_style.mkdir()
    # A learner in another pid namespace (a container sharing /tmp): its pid means
    # nothing here, but its socket still answers.
    listening = tmp_path / f"seedrl-{dead}-uvwx"
    listening.mkdir()
    # A serving tier's directory, where only a frontend's socket may still answer.
    frontend = tmp_path / f"seedrl-{dead}-yzab"
    frontend.mkdir()
    (frontend / LOCAL_SOCKET_NAME).touch()
    with (
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server,
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as frontend_server,
    ):
        server.bind(str(listening / LOCAL_SOCKET_NAME))
        server.listen()
        frontend_server.bind(str(frontend / "frontend-1.sock"))
        frontend_server.listen()
        removed = remove_stale_local_sockets(tmp=str(tmp_path))
    assert sorted(removed) == sorted([str(stale_with_file), str(stale_empty)])
    assert not stale_with_file.exists() and not stale_empty.exists()
    assert live.exists() and other.exists() and old_style.exists() and listening.exists()
    assert frontend.exists()


def test_same_host_actor_uses_the_unix_socket_and_the_learner_removes_it(tmp_path) -> None:
    with learner_process(tmp_path, env=INFO) as (learner, port):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            offered = get_info(channel).local_address
        path = offered.removeprefix("unix:")
        assert offered.startswith("unix:") and os.path.exists(path)
        with running(actor_args(port, 1, 2), env=INFO):
            learner.wait_for("connected from unix:", 60)
        with running(actor_args(port, 1, 2, "--no-local-socket"), env=INFO):
            learner.wait_for("connected from ipv4:127.0.0.1", 60)
        learner.stop()
        assert learner.popen.returncode == 0, learner.output()
    assert not os.path.exists(os.path.dirname(path))


def test_learner_without_local_socket_offers_none(tmp_path) -> None:
    with learner_process(tmp_path, "--no-local-socket", env=INFO) as (learner, port):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            assert get_info(channel).local_address == ""
        with running(actor_args(port, 1, 2), env=INFO):
            learner.wait_for("connected from ipv4:127.0.0.1", 60)


def test_actor_falls_back_to_tcp_when_the_offered_socket_does_not_answer(tmp_path) -> None:
    """A socket path that exists but takes no connection (a stale file, another user's
    learner): the actor warns once and streams over TCP instead."""
    stale = tmp_path / "stale.sock"
    stale.touch()

    async def main() -> Actor:
        servicer, batcher, _ = echo_servicer(LearnerConfig(), local_address=f"unix:{stale}")
        server = grpc.aio.server()
        add_learner_service(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        batching = asyncio.create_task(batcher.run())
        try:
            config = ActorConfig(
                learner=f"127.0.0.1:{port}", envs_per_actor=2, max_frames=200, max_backoff_s=0.2
            )
            actor = Actor(config, 0)
            assert await asyncio.wait_for(asyncio.to_thread(actor.run), 30) == 0
            return actor
        finally:
            batcher.close()
            await server.stop(grace=None)
            batching.cancel()

    actor = asyncio.run(main())
    assert actor.local_failed
    assert actor.frames >= 200
    assert actor.target == actor.home


def test_frontends_on_a_unix_bind_share_its_actors_through_their_own_sockets(tmp_path) -> None:
    """A unix ``--bind`` has no port group: frontend 0 holds the path (its own socket), the
    others listen on sockets of their own beside it, and frontend 0 offers them in turn, so
    actors that dial the path spread over both frontends (an actor offered the path stays
    and asks nothing again, so the turns alternate); a second learner on the path is refused."""
    bound = f"unix:{tmp_path}/learner.sock"
    logdir = tmp_path / "run"
    extra = ("--serving-processes", "2", "--bind", bound)
    with learner_process(logdir, *extra, env=INFO, timeout=240) as (learner, _port):
        with grpc.insecure_channel(bound) as channel:
            turns = [get_info(channel).local_address for _ in range(2)]
        names = sorted(os.path.basename(a.removeprefix("unix:")) for a in turns)
        # Frontend 0's is the path; frontend 1's is named from it, in the same directory.
        assert names == ["learner-frontend-1.sock", "learner.sock"], turns
        assert bound in turns
        assert {os.path.dirname(a.removeprefix("unix:")) for a in turns} == {str(tmp_path)}
        second = subprocess.run(
            [sys.executable, "-m", "learner", "--bind", bound, "--serving-processes", "2",
             "--logdir", str(tmp_path / "second"), "--progress", "off"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert second.returncode != 0 and "another process listens there" in second.stderr
        actors = ActorConfig(learner=bound, num_actors=4, envs_per_actor=1)
        actors_reach_every_frontend(learner, actors, 2, INFO)
        learner.stop()
        assert learner.popen.returncode == 0, learner.output()
    assert "Traceback" not in learner.output()
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".sock")]  # gone too


def test_each_frontend_offers_its_own_socket_and_same_host_actors_switch_to_it(
    tmp_path,
) -> None:
    """With serving frontends each frontend listens on a socket of its own (unix sockets
    have no port group to share) beside the learner's in its private directory, and offers
    every frontend's in turn, so same-host actors spread evenly over the frontends even
    when the kernel hands their TCP connections to one; all removed with the learner."""
    with learner_process(tmp_path, "--serving-processes", "2", env=INFO) as (learner, port):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:  # one frontend answers
            turns = [get_info(channel).local_address for _ in range(4)]
        names = [os.path.basename(a.removeprefix("unix:")) for a in turns]
        assert sorted(names[:2]) == ["frontend-0.sock", "frontend-1.sock"], names
        assert names[2:] == names[:2], names
        offered = set(turns)
        for _ in range(20):  # the kernel spreads new connections over the port's group
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                offered.add(get_info(channel).local_address)
        assert offered == set(turns), offered
        directory = {os.path.dirname(a.removeprefix("unix:")) for a in offered}
        assert len(directory) == 1
        for address in offered:
            assert stat.S_ISSOCK(os.stat(address.removeprefix("unix:")).st_mode)
        with running(actor_args(port, 2, 2), env=INFO):
            learner.wait_for("connected from unix:", 60)
        learner.stop()
        assert learner.popen.returncode == 0, learner.output()
    assert not os.path.exists(directory.pop())


def test_an_actor_asking_again_through_its_offered_socket_takes_no_turn(tmp_path) -> None:
    """An actor that took a frontend's offered socket calls GetInfo again through it; that
    call must not advance the frontend's turn, or the next actor over TCP on the same
    frontend is offered the same socket and both land on one frontend."""
    with learner_process(tmp_path, "--serving-processes", "2", env=INFO) as (learner, port):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as tcp:  # one connection: one frontend
            first = get_info(tcp).local_address
            with grpc.insecure_channel(first) as local:
                assert get_info(local).local_address
            second = get_info(tcp).local_address
        both = {frontend_local_address(first, index) for index in (0, 1)}
        assert {first, second} == both, (first, second)
        learner.stop()
        assert learner.popen.returncode == 0, learner.output()
