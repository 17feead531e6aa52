"""Actors on another host, for real: learner and actors in two network namespaces.

The learner runs in one namespace, bound to its veth address; the actors run in the
other and reach it only over the veth link. The test trains across the link, pulls the
cable (``ip link set ... down``) for a few seconds, plugs it back in and checks that
the actors get through again and training goes on. Needs root (CI runs as root); skips
with the reason otherwise.
"""

from __future__ import annotations

import sys
import time

import pytest
from netns import NetnsUnavailable, TwoHosts, check_available, two_hosts
from support import read_records, running, wait_until

LEARNER_PORT = 8686  # each namespace has its own ports: no clash with anything on the host
FRAMES_BEFORE_CUT = 3000
FRAMES_AFTER_CUT = 3000
SHORT_CUT_S = 4.0
LONG_CUT_TIMEOUT_S = 60.0
"""gRPC keepalive (10 s + 5 s, seedrl.transport) notices the dead link well before this."""


@pytest.fixture
def hosts():
    try:
        check_available()
    except NetnsUnavailable as exc:
        pytest.skip(f"two-host network test needs network namespaces: {exc}")
    with two_hosts() as pair:
        yield pair


def frames(logdir) -> int:
    records = read_records(logdir)
    return int(records[-1]["frames"]) if records else 0


def learner_in(hosts: TwoHosts, logdir, *extra: str) -> list[str]:
    return hosts.left.command(
        [
            sys.executable, "-m", "learner", "--bind", hosts.left.address,
            "--port", str(LEARNER_PORT), "--logdir", str(logdir), "--progress", "off",
            "--log-interval-s", "0.5", "--no-tensorboard", "--max-seconds", "150",
            "--serving-processes", "0", *extra,
        ]
    )  # fmt: skip


def actors_in(hosts: TwoHosts, *extra: str) -> list[str]:
    return hosts.right.command(
        [
            sys.executable, "-m", "actors", "--learner", f"{hosts.left.address}:{LEARNER_PORT}",
            "--num-actors", "2", "--envs-per-actor", "4", "--max-backoff-s", "1", *extra,
        ]
    )  # fmt: skip


def actors_that_lost_the_learner(lines: list[str]) -> set[str]:
    """Actor ids from "actor <id>: learner unavailable ..." log lines."""
    return {
        line.split("actor ")[1].split(":")[0] for line in lines if "learner unavailable" in line
    }


@pytest.mark.long
def test_actors_train_across_the_link_and_survive_cuts(hosts, tmp_path):
    """Train over the link; a short cut is ridden out, a long one forces a real reconnect."""
    # A learner on a routable address refuses to serve without a token (or --insecure).
    env = {"SEEDRL_LOG_LEVEL": "INFO", "SEEDRL_AUTH_TOKEN": "netns-test-token"}
    with running(learner_in(hosts, tmp_path), env) as learner:
        learner.wait_for("listening on", 60)
        with running(actors_in(hosts), env) as actors:
            wait_until(
                lambda: frames(tmp_path) >= FRAMES_BEFORE_CUT,
                timeout=90,
                what=f"{FRAMES_BEFORE_CUT} frames across the veth link",
            )
            assert read_records(tmp_path)[-1]["actors_connected"] == 2

            # A short cut: no frame can cross while the cable is out; TCP carries on after.
            hosts.set_link(up=False)
            try:
                time.sleep(SHORT_CUT_S / 2)
                stalled = frames(tmp_path)
                time.sleep(SHORT_CUT_S / 2)
                during = frames(tmp_path)
            finally:
                hosts.set_link(up=True)
            assert during == stalled, "frames flowed while the cable was out"
            wait_until(
                lambda: frames(tmp_path) >= during + FRAMES_AFTER_CUT,
                timeout=90,
                what="training to continue after a short cut",
            )

            # A long cut: gRPC keepalive declares the connection dead; the actors back
            # off and retry until the link is back, then reconnect under a new run_id.
            hosts.set_link(up=False)
            try:
                # Both actors must find their connection dead before the link returns;
                # otherwise the slower one's TCP stream just carries on (one connection).
                wait_until(
                    lambda: len(actors_that_lost_the_learner(actors.lines)) >= 2,
                    timeout=LONG_CUT_TIMEOUT_S,
                    what="both actors to declare the learner unavailable",
                )
            finally:
                hosts.set_link(up=True)
            resumed_from = frames(tmp_path)
            wait_until(
                lambda: frames(tmp_path) >= resumed_from + FRAMES_AFTER_CUT,
                timeout=90,
                what="training to continue after the actors reconnected",
            )
            # Each actor ends its own backoff (up to --max-backoff-s 1): the first one back
            # can send these frames before the second has redialled.
            wait_until(
                lambda: read_records(tmp_path)[-1]["actors_connected"] == 2,
                timeout=30,
                what="both actors reconnected",
            )
            assert read_records(tmp_path)[-1]["learner_steps"] > 0
    # Each actor logs its connection count when it stops.
    counts = [
        int(line.split(" connections")[0].split()[-1])
        for line in actors.lines
        if " connections, RSS" in line
    ]
    assert len(counts) == 2 and all(c >= 2 for c in counts), actors.output()
