"""The serving tier (``--serving-processes N``): frontend processes, one model process.

The slot table at toy size in this process; then one learner with two frontends training
CartPole from real actor processes (actors/ unchanged): frames flow and checkpoints are
written, a bad frame ends only its own stream, a frontend killed with SIGKILL costs only
its streams (its actors reconnect, the learner restarts it); the conformance suite's
learner side against two frontends; and what the tier does not carry yet is refused.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import grpc
import numpy as np
import pytest
from support import (
    ROOT,
    actor_args,
    learner_args,
    learner_process,
    read_records,
    running,
    wait_until,
)
from wire_clients import act, frame, get_info, hello, lockstep

from learner.agents.models import UnsupportedSetup
from learner.serving.slots import RowSpans, SlotTable, TableSpec
from learner.serving.tier import MAX_DEATHS, check_tier_supported
from seedrl import codec
from seedrl.config import LearnerConfig
from seedrl.conformance.cases import LEARNER_CASES, Status
from seedrl.conformance.config import LearnerSuiteConfig
from seedrl.conformance.learner_suite import run_learner_suite
from seedrl.envs import describe_env

K = 2
INVALID = grpc.StatusCode.INVALID_ARGUMENT
STARTED = re.compile(r"serving frontend (\d+) \(pid (\d+)\)")
TIER = ["--serving-processes", "2"]
START_TIMEOUT_S = 240.0  # two spawned frontends import torch and gRPC on a shared host


# ---------------------------------------------------------------------- the table


def test_row_spans_are_contiguous_first_fit_and_reused():
    spans = RowSpans(8)
    assert (spans.take(3), spans.take(2)) == (0, 3)
    spans.give_back(0, 3)  # free now: rows 0-2 and 5-7, no run of four
    assert spans.take(4) is None
    assert (spans.take(3), spans.take(3)) == (0, 5)
    assert spans.take(1) is None


def test_a_row_written_in_one_mapping_is_read_in_another():
    spec = TableSpec(rows=4, lanes=2, obs_row_bytes=16, action_dtype="<i8", action_shape=())
    owner = SlotTable(spec)
    other = SlotTable(spec, owner.shm.name)
    try:
        obs, reward, terminated, _ = other.row_views(1, 2)
        obs[:] = np.arange(8, dtype=np.float32).tobytes()
        reward[:] = np.array([1.5, -2.0], np.float32).tobytes()
        terminated[:] = np.array([False, True]).tobytes()
        other.req_L[1] = 7
        seen = owner.row_views(1, 2)
        assert np.frombuffer(seen[0], np.float32).tolist() == list(range(8))
        assert np.frombuffer(seen[1], np.float32).tolist() == [1.5, -2.0]
        assert np.frombuffer(seen[2], np.bool_).tolist() == [False, True]
        assert owner.req_L.tolist() == [0, 7]
        owner.action_RA[1:3] = [1, 0]
        assert other.action_RA.tolist() == [0, 1, 0, 0]
        del obs, reward, terminated, seen
    finally:
        other.close()
        owner.close()


# ---------------------------------------------------------------------- refusals


def test_what_the_tier_does_not_carry_is_refused_in_one_line():
    spec = describe_env("CartPole-v1")
    config = LearnerConfig(serving_processes=2, self_play=True)
    with pytest.raises(UnsupportedSetup, match="--serving-processes 2 does not serve --self-play"):
        check_tier_supported(config, spec)
    check_tier_supported(LearnerConfig(serving_processes=2), spec)


def test_torchrun_ranks_with_frontends_are_refused_before_anything_starts():
    env = {**os.environ, "WORLD_SIZE": "2", "RANK": "0", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "learner", *TIER], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--serving-processes" in lines[0], done.stderr


# ------------------------------------------------------------ a learner with two frontends


@pytest.fixture(scope="module")
def tier(tmp_path_factory):
    """(learner proc, port, logdir) with four actor processes training beside it."""
    logdir = tmp_path_factory.mktemp("serving_tier")
    env = {"SEEDRL_LOG_LEVEL": "INFO"}
    extra = [
        *TIER, "--checkpoint-interval-s", "3", "--max-envs", "64", "--max-envs-per-peer", "64",
        "--batch-size", "4", "--unroll-length", "16",
    ]  # fmt: skip
    with learner_process(logdir, *extra, env=env, timeout=START_TIMEOUT_S) as (learner, port):
        with running(actor_args(port, 4, 1), env=env):
            yield learner, port, logdir
            assert learner.popen.poll() is None, learner.output()


def _frames(logdir) -> int:
    records = read_records(logdir)
    return int(records[-1]["frames"]) if records else 0


def _dropped(logdir) -> int:
    records = read_records(logdir)
    return int(records[-1]["frames_dropped"]) if records else 0


def test_two_frontends_train_cartpole_from_real_actors(tier):
    learner, port, logdir = tier
    wait_until(lambda: _frames(logdir) >= 2000, 180, what="2000 frames")
    wait_until(lambda: (logdir / "checkpoint.pt").exists(), 60, what="a checkpoint")
    # Unrolls and episodes are built in the frontends and still train and reach the metrics.
    wait_until(lambda: read_records(logdir)[-1]["episodes"] > 0, 60, what="an episode counted")
    records = read_records(logdir)
    assert records[-1]["learner_steps"] > 0, records[-1]
    assert records[-1]["episode_length_mean"] > 0, records[-1]
    assert not any("Traceback" in line for line in learner.lines), learner.output()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        spec = get_info(channel).env
        outcome = act(channel, [hello(spec, K), frame(K), frame(K), frame(K)])
    kinds = [r.WhichOneof("kind") for r in outcome.replies]
    assert kinds == ["accept", "actions", "actions", "actions"], outcome
    for reply in outcome.replies[1:]:
        actions = codec.decode_tensor(reply.actions.actions, "actions")
        assert actions.shape == (K,) and set(actions.tolist()) <= {0, 1}, actions


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        (frame(K, obs=np.full((K, 4), np.nan, np.float32)), "observations: contains NaN or inf"),
        (frame(K, reward=np.array([1.0, np.inf], np.float32)), "rewards: contains NaN or inf"),
        (frame(K, reward=np.ones(K, np.float64)), "rewards: dtype float64 but expected float32"),
    ],
    ids=["obs NaN (the model's check)", "reward inf", "reward dtype (the frontend's check)"],
)
def test_a_bad_frame_ends_only_its_own_stream(tier, bad, words):
    _learner, port, _logdir = tier
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        spec = get_info(channel).env
        with lockstep(channel, spec, K) as good:  # the same connection: the same frontend
            outcome = act(channel, [hello(spec, K), frame(K), bad])
            assert outcome.code == INVALID, outcome
            assert words in outcome.details, outcome.details
            assert [r.WhichOneof("kind") for r in outcome.replies] == ["accept", "actions"]
            good.wait_for_more(5)


def test_a_killed_frontend_costs_only_its_streams_and_is_restarted(tier):
    learner, _port, logdir = tier
    learner.wait_for("connected from", 60)
    pids = {int(i): int(pid) for i, pid in STARTED.findall("\n".join(learner.lines))}
    assert sorted(pids) == [0, 1], learner.output()
    streams = [sum(f"frontend {i} " in ln and "connected from" in ln for ln in learner.lines)
               for i in (0, 1)]  # fmt: skip
    victim = int(np.argmax(streams))  # the one serving actors, so some streams are cut
    connected_before = sum(streams)
    frames_before = _frames(logdir)
    dropped_before = _dropped(logdir)
    os.kill(pids[victim], signal.SIGKILL)
    learner.wait_for(f"serving frontend {victim} died", 30)
    wait_until(
        lambda: any(pid != pids[victim] for pid in _pids_of(learner, victim)), 120,
        what=f"frontend {victim} restarted",
    )  # fmt: skip
    # Its actors reconnected (to the other frontend or the restarted one) and training goes on.
    wait_until(
        lambda: sum("connected from" in ln for ln in learner.lines) > connected_before, 120,
        what="the cut actors reconnected",
    )  # fmt: skip
    wait_until(lambda: _frames(logdir) >= frames_before + 1000, 120, what="1000 more frames")
    assert learner.popen.poll() is None, learner.output()
    # Its streams' partial unrolls (built in the dead frontend) are counted lost.
    wait_until(lambda: _dropped(logdir) > dropped_before, 30, what="frames_dropped to grow")


def test_a_second_learner_on_the_port_is_refused_before_it_spawns_anything(tier, tmp_path):
    """The frontends share the port with SO_REUSEPORT; another learner must not join them."""
    _learner, port, _logdir = tier
    args = learner_args(port, tmp_path, *TIER)
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"could not bind the learner to 127.0.0.1:{port}" in done.stderr, done.stderr


def test_a_frontend_that_keeps_dying_ends_the_run_in_one_line(tmp_path):
    with learner_process(tmp_path, *TIER, env={"SEEDRL_LOG_LEVEL": "INFO"},
                         timeout=START_TIMEOUT_S) as (learner, _port):  # fmt: skip
        killed: set[int] = set()
        while learner.popen.poll() is None and len(killed) < MAX_DEATHS + 1:
            pid = wait_until(
                lambda: next((p for p in _pids_of(learner, 0) if p not in killed), None), 120,
                what="frontend 0 (re)started",
            )  # fmt: skip
            os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        assert learner.wait(timeout=60) == 1, learner.output()
    errors = [line for line in learner.lines if "error:" in line]
    assert len(errors) == 1, learner.output()
    assert re.search(r"serving frontend 0 failed 4 times in 60 s \(last exit code -9\)", errors[0])


def _pids_of(learner, index: int) -> list[int]:
    return [int(pid) for i, pid in STARTED.findall("\n".join(learner.lines)) if int(i) == index]


# ---------------------------------------------------------------------- conformance


def test_the_learner_side_of_the_conformance_suite_passes_against_two_frontends(tmp_path):
    token = "conformance-token"
    extra = [*TIER, "--auth-token", token, "--total-frames", "600", "--no-train"]
    with learner_process(tmp_path, *extra, timeout=START_TIMEOUT_S) as (learner, port):
        config = LearnerSuiteConfig(auth_token=token, wait_shutdown_s=60)
        report = run_learner_suite(f"127.0.0.1:{port}", config)
        assert learner.wait(timeout=90) == 0, learner.output()
    # Every process of the tier ended cleanly: no traceback, not even an ignored one.
    assert not any("Traceback" in line for line in learner.lines), learner.output()
    assert report.ok, report.text()
    skipped = {v.case.id for v in report.verdicts if v.status is Status.SKIP}
    assert skipped == {"frame-stack-accepted", "rejects-bad-leaves", "rejects-missing-agents",
                       "agent-actions-reply"}  # fmt: skip
    assert len(report.verdicts) == len(LEARNER_CASES)
