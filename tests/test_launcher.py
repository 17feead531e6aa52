"""The launcher's two ways to start actors: forked from itself (default) or exec'd."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from support import running, wait_until
from wire_clients import child_pids

from actors import process
from actors.launcher import ForkedActor
from seedrl.config import ActorConfig

UNREACHABLE = "127.0.0.1:9"  # nothing listens: actors keep retrying, which is all these need


def _cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().decode().split("\0")[:-1]


def test_a_forked_actor_reports_its_exit_code(monkeypatch):
    """The child runs its config's actors and leaves with their exit code (2: refused)."""
    seen = []

    def refused(config: ActorConfig) -> int:
        seen.append(config)  # in the child: the parent's list stays empty
        return 2 if config.learner == UNREACHABLE else 0

    monkeypatch.setattr(process, "run_process", refused)
    proc = ForkedActor(ActorConfig(learner=UNREACHABLE))
    assert proc.wait(timeout=30) == 2 and seen == []
    assert proc.poll() == 2
    proc.send_signal(signal.SIGTERM)  # a reaped actor is not signalled (its pid may be reused)


def test_a_forked_actor_waits_with_a_timeout_and_stops_on_sigterm():
    proc = ForkedActor(ActorConfig(learner=UNREACHABLE, max_backoff_s=0.2))
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.5)  # still retrying the unreachable learner
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
@pytest.mark.parametrize("method", ["fork", "exec"])
def test_the_launcher_starts_actors_by_the_method_asked(method):
    """fork: the children are copies of the launcher (same command line); exec: each
    child is a fresh `python -m actors actor`."""
    args = [
        sys.executable, "-m", "actors", "--learner", UNREACHABLE, "--num-actors", "2",
        "--start-method", method,
    ]  # fmt: skip
    with running(args) as launcher:

        def both_started() -> list[int] | None:
            pids = child_pids(launcher.popen.pid)
            return pids if len(pids) == 2 else None

        children = wait_until(both_started, 30, what="2 actor processes")
        launcher_cmdline = _cmdline(launcher.popen.pid)
        for pid in children:
            cmdline = _cmdline(pid)
            if method == "fork":
                assert cmdline == launcher_cmdline
            else:
                assert cmdline[1:4] == ["-m", "actors", "actor"]


def test_an_unknown_start_method_is_refused():
    with pytest.raises(ValueError, match="--start-method"):
        ActorConfig(start_method="spawn")
