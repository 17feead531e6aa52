"""The reference C++ actor (actors/cpp/): it passes the conformance suite and trains
CartPole-v1 to 475 against an unmodified learner.

The module builds it (``make actors-cpp``) when the toolchain is there and skips, saying
what to install, when it is not; CI installs the toolchain and sets
``SEEDRL_REQUIRE_CPP=1``, which turns that skip into a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from contextlib import ExitStack

import pytest
from support import ROOT, learner_process, running, wait_until

from seedrl import envs
from seedrl.conformance.actor_suite import run_actor_suite
from seedrl.conformance.cases import ACTOR_CASES, Status
from seedrl.conformance.config import ActorSuiteConfig
from seedrl.conformance.scripted import Script, ScriptedLearner, Serve
from seedrl.proto import seedrl_pb2 as pb

BINARY = ROOT / "actors" / "cpp" / "build" / "seedrl-actor"
PACKAGES = "libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc cmake g++"
TOOLS = ("cmake", "c++", "protoc", "grpc_cpp_plugin")

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def cpp_actor() -> str:
    """The built actor, (re)built by ``make actors-cpp``; skipped without a toolchain."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    required = os.environ.get("SEEDRL_REQUIRE_CPP") == "1"
    if missing:
        reason = f"C++ toolchain missing ({', '.join(missing)}): apt-get install {PACKAGES}"
        if required:
            pytest.fail(reason)
        pytest.skip(reason)
    done = subprocess.run(["make", "actors-cpp"], cwd=ROOT, capture_output=True, text=True,
                          timeout=840)  # fmt: skip
    if done.returncode != 0:
        pytest.fail(f"make actors-cpp failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return str(BINARY)


def test_cpp_actor_passes_the_conformance_suite(cpp_actor):
    command = [cpp_actor, "--learner", "{learner}", "--envs-per-actor", "{num_envs}",
               "--max-backoff-s", "{max_backoff_s}"]  # fmt: skip
    report = run_actor_suite(command, ActorSuiteConfig())
    assert report.ok, report.text()
    skipped = {v.case.id for v in report.verdicts if v.status is Status.SKIP}
    assert skipped == {"box-actions-clipped", "frame-stack-offered", "frame-stack-not-offered",
                       "observation-leaves", "agent-rows", "acting-rows", "agent-actions-applied",
                       "agent-episode-ends"}  # fmt: skip
    assert len(report.verdicts) == len(ACTOR_CASES)


def test_cpp_actors_train_cartpole_to_475(cpp_actor, tmp_path):
    """Two C++ actors x 32 envs and `python -m learner` as `make learner` starts it."""
    extra = ["--target-return", "475", "--max-seconds", "600"]
    with learner_process(tmp_path, *extra, timeout=180) as (learner, port), ExitStack() as stack:
        args = [cpp_actor, "--learner", f"127.0.0.1:{port}", "--envs-per-actor", "32"]
        actors = [stack.enter_context(running([*args, "--seed", str(s)])) for s in (1, 2)]
        assert learner.wait(timeout=700) == 0, learner.output()
        for actor in actors:  # told Shutdown{final: true}: they exit 0 by themselves
            assert actor.wait(timeout=30) == 0, actor.output()
            assert "the learner finished training" in actor.output()
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["solved"] and result["episode_return_mean"] >= 475, result


def test_cpp_actor_exits_2_on_an_env_it_cannot_run(cpp_actor):
    learner = ScriptedLearner(envs.describe_env("Acrobot-v1"), Script(acts=[Serve(1, True)]), None)
    port = learner.start("127.0.0.1:0")
    try:
        done = subprocess.run([cpp_actor, "--learner", f"127.0.0.1:{port}"],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    finally:
        learner.stop()
    assert done.returncode == 2
    assert "unsupported env Acrobot-v1" in done.stderr
    assert not learner.streams, "it must not open a stream for an env it cannot run"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ([], "--learner HOST:PORT is required"),
        (["--learner", "x:1", "--envs-per-actor", "0"], "--envs-per-actor must be in [1, 4096]"),
        (["--learner", "x:1", "--frobnicate", "1"], "unknown flag --frobnicate"),
        (["--learner", "x:1", "--seed", "many"], "--seed: not a number: many"),
    ],
)
def test_cpp_actor_bad_flags_exit_2_with_one_line(cpp_actor, args, words):
    done = subprocess.run([cpp_actor, *args], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert done.stderr.strip() == f"seedrl-actor: {words}"


@pytest.mark.parametrize("ca", ["missing", "directory", "empty", "not-pem"])
def test_cpp_actor_refuses_a_ca_file_it_cannot_read(cpp_actor, tmp_path, ca):
    """An unreadable --tls-ca exits 2 with one line; gRPC would take the empty root
    certificates as "trust the system's public CAs" and connect anyway."""
    path = tmp_path / ca
    if ca == "directory":
        path.mkdir()
    elif ca == "empty":
        path.write_text("")
    elif ca == "not-pem":
        path.write_text("not a certificate\n")
    args = [cpp_actor, "--learner", "127.0.0.1:9", "--tls-ca", str(path)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"seedrl-actor: --tls-ca {path}: no PEM certificate could be read from it"
    )


def test_sigterm_ends_a_retrying_cpp_actor_with_0(cpp_actor):
    with running([cpp_actor, "--learner", "127.0.0.1:9"]) as actor:
        actor.wait_for("learner unavailable", 30)
        started = time.monotonic()
        actor.signal(signal.SIGTERM)
        assert actor.wait(timeout=10) == 0
    assert time.monotonic() - started < 5, "a retry wait must not delay the exit"


def test_cpp_actors_on_the_learners_host_take_each_frontends_own_socket(cpp_actor, tmp_path):
    """With serving frontends each offers its own unix socket in GetInfo, in turn: C++
    actors that dialled the loopback port switch to the socket offered, so they reach
    both frontends over unix sockets (before, every one stayed on TCP)."""
    extra = ("--serving-processes", "2")
    env = {"SEEDRL_LOG_LEVEL": "INFO"}
    with learner_process(tmp_path, *extra, env=env, timeout=240) as (learner, port):
        args = [cpp_actor, "--learner", f"127.0.0.1:{port}", "--envs-per-actor", "2"]
        with ExitStack() as stack:
            actors = [stack.enter_context(running([*args, "--seed", str(s)])) for s in (1, 2)]
            for actor in actors:
                actor.wait_for("learner on this host, using unix:", 60)

            def on_unix(index: int) -> bool:
                mark = f"frontend {index} learner.serving.servicer: actor"
                return any(mark in line and "from unix:" in line for line in learner.lines)

            for index in (0, 1):
                wait_until(lambda i=index: on_unix(i), 60, what=f"a C++ actor on frontend {index}")
        learner.stop()
        assert learner.popen.returncode == 0, learner.output()


class _StaleSocketLearner(ScriptedLearner):
    """A scripted learner that offers a socket file nobody listens on."""

    def __init__(self, socket_path: str) -> None:
        script = Script(acts=[Serve(50, True)])
        super().__init__(envs.describe_env("CartPole-v1"), script, None)
        self.socket_path = socket_path

    def info_message(self, frame_stack: int) -> pb.LearnerInfo:
        info = super().info_message(frame_stack)
        info.local_address = f"unix:{self.socket_path}"
        return info


def test_cpp_actor_stays_on_tcp_when_the_offered_socket_does_not_answer(cpp_actor, tmp_path):
    """A socket path that exists but takes no connection (a stale file, another user's
    learner): the C++ actor says so once and streams over TCP; --no-local-socket never
    tries it."""
    stale = tmp_path / "stale.sock"
    stale.touch()
    for flags, tried in (([], True), (["--no-local-socket"], False)):
        learner = _StaleSocketLearner(str(stale))
        port = learner.start("127.0.0.1:0")
        try:
            done = subprocess.run(
                [cpp_actor, "--learner", f"127.0.0.1:{port}", "--max-backoff-s", "0.2", *flags],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
        finally:
            learner.stop()
        assert done.returncode == 0, done.stderr
        assert ("using unix:" in done.stderr) == tried, done.stderr
        assert (done.stderr.count("staying on TCP") == 1) == tried, done.stderr
        assert "the learner finished training" in done.stderr
        assert len(learner.streams) == 1 and len(learner.streams[0].frames) >= 50
