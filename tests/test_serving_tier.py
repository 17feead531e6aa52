"""The serving tier (``--serving-processes N``): frontend processes, one model process.

The slot table at toy size in this process; then one learner with two frontends training
CartPole from real actor processes (actors/ unchanged): frames flow and checkpoints are
written, a bad frame ends only its own stream, a frontend killed with SIGKILL costs only
its streams (its actors reconnect, the learner restarts it); the conformance suite's
learner side against two frontends; and what the tier does not carry yet is refused.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import re
import signal
import socket
import subprocess
from dataclasses import replace
from types import SimpleNamespace

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
from wire_clients import HeldStream, act, frame, get_info, hello, lockstep

from learner.agents.models import UnsupportedSetup
from learner.serving.admission import Admission, SharedCounts
from learner.serving.frontend_stats import FrontendCounters, FrontendStats
from learner.serving.slots import RowSpans, SlotTable, TableSpec
from learner.serving.tier import (
    MAX_DEATHS,
    Frontend,
    PortLock,
    SlotBatcher,
    answer_controls,
    check_tier_supported,
)
from learner.state.counters import StepCounter
from learner.state.stats import LearnerStats
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
START_TIMEOUT_S = 240.0  # two spawned frontends import gRPC and numpy on a shared host


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


class _Engine:
    """The engine's part the slot batcher calls: every row's action is 7."""

    normalizer = None
    agent_policy = None  # one policy
    self_play = None

    def __init__(self) -> None:
        self.learner_step = StepCounter()

    def begin_batch(self) -> None:
        pass

    def serve_rows(self, rows, policy_B=None) -> tuple[np.ndarray, None]:
        return np.full(len(rows.slot_B), 7, np.int64), None

    def release_later(self, conn) -> None:
        pass


def _batcher(batch: int, quorum: float, timeout_ms: float) -> tuple[SlotBatcher, SlotTable]:
    table = SlotTable(TableSpec(8, 4, 4 * 4, "<i8", ()))
    rows = SimpleNamespace(
        obs_dtype=np.dtype(np.float32), frame_shape=(4,), multi_agent=False,
        reply=SimpleNamespace(policy_R=None),
        allocate_rows=lambda begin, count: np.arange(begin, begin + count),
    )  # fmt: skip
    config = LearnerConfig(
        inference_batch_size=batch, inference_quorum=quorum, inference_timeout_ms=timeout_ms
    )
    return SlotBatcher(table, _Engine(), rows, LearnerStats(), config), table  # type: ignore[arg-type]


def _answered(batcher: SlotBatcher, table: SlotTable, lanes: list[int]) -> list[int]:
    """The lanes of ``lanes`` answered, once every one of them is (a bounded wait)."""

    async def scenario() -> list[int]:
        task = asyncio.create_task(batcher.run())
        try:
            for _ in range(3000):
                if (table.rep_L[lanes] == table.req_L[lanes]).all():
                    break
                await asyncio.sleep(0.01)
            # Read before the close, which serves what is waiting.
            return [lane for lane in range(table.spec.lanes) if table.rep_L[lane] > 0]
        finally:
            batcher.close()
            await task

    return asyncio.run(scenario())


def test_a_batch_waits_for_quorum_and_a_closed_streams_frame_never_counts():
    batcher, table = _batcher(batch=64, quorum=0.5, timeout_ms=12.0)
    try:
        lanes = [batcher.lease(0, 1)[0] for _ in range(4)]  # quorum: 2 of 4 streams
        table.req_L[lanes[0]] += 1
        batcher.rung()
        assert not batcher._due.is_set()
        table.req_L[lanes[1]] += 1
        batcher.release(lanes[1])  # closed with its frame unanswered: 2 of 3 now
        batcher.rung()
        assert not batcher._due.is_set()
        table.req_L[lanes[2]] += 1
        batcher.rung()
        assert batcher._due.is_set()
        assert batcher._ready_lanes().tolist() == [lanes[0], lanes[2]]
    finally:
        table.close()


def test_a_batch_is_due_once_its_lanes_rows_reach_the_batch_size():
    batcher, table = _batcher(batch=4, quorum=1.0, timeout_ms=3.6e6)  # no deadline here
    try:
        wide, narrow, _idle = (batcher.lease(0, k)[0] for k in (3, 1, 1))
        table.req_L[[wide, narrow]] += 1  # 4 rows from 2 of 3 streams
        assert _answered(batcher, table, [wide, narrow]) == [wide, narrow]
        assert table.action_RA[:4].tolist() == [7, 7, 7, 7]
    finally:
        table.close()


def test_a_frame_short_of_the_batch_rule_is_answered_at_the_deadline():
    batcher, table = _batcher(batch=64, quorum=1.0, timeout_ms=1.0)
    try:
        lanes = [batcher.lease(0, 1)[0] for _ in range(3)]
        table.req_L[lanes[1]] += 1  # one of 3 streams, one row of 64
        assert _answered(batcher, table, [lanes[1]]) == [lanes[1]]
    finally:
        table.close()


def test_a_lease_the_table_is_full_for_takes_the_releases_waiting_in_other_pipes():
    """Frontend A's stream held every row and closed: A sent its release, then gave the
    admission back, and B's new stream, admitted in that moment, asks for the rows before
    the model has read A's pipe. The model takes A's release first and B gets the rows;
    a lease with no release anywhere is still refused."""
    batcher, table = _batcher(batch=4, quorum=1.0, timeout_ms=1.0)
    a, b = Frontend(0), Frontend(1)
    ends = {}
    for f in (a, b):
        f.control, ends[f.index] = multiprocessing.Pipe()
    try:
        lane, _, problem = batcher.lease(a.index, 8)  # every row of the table
        assert not problem
        ends[a.index].send(("release", lane))
        ends[b.index].send(("allocate", 8))
        answer_controls(batcher, b, [a, b])
        assert ends[b.index].poll(5)
        kind, _, begin, problem = ends[b.index].recv()
        assert (kind, begin, problem) == ("lease", 0, "")
        assert not a.control.poll()  # A's release was taken on the way
        ends[a.index].send(("allocate", 1))  # now truly full: B holds every row
        answer_controls(batcher, a, [a, b])
        assert "full" in ends[a.index].recv()[3]
    finally:
        for f in (a, b):
            f.control.close()
            ends[f.index].close()
            os.close(f.bell)
        table.close()


def test_shared_counts_make_every_holder_admit_against_the_same_limits(tmp_path):
    config = LearnerConfig(max_actors=3, max_envs=8, max_envs_per_peer=5)
    block = SharedCounts.create(2, config.max_actors, tmp_path)
    views = [SharedCounts(block.spec, holder=i) for i in (0, 1)]
    first, second = (Admission(config, v) for v in views)
    try:
        assert first.open_stream() is None and second.open_stream() is None
        first.hello_ended()
        second.hello_ended()
        assert first.admit("ipv4:10.0.0.1", 4) is None
        assert second.admit("ipv4:10.0.0.1", 2) is not None  # the peer's 5 span both holders
        assert second.admit("ipv4:10.0.0.2", 3) is None
        assert second.admit("ipv4:10.0.0.3", 2) == (
            "learner is full: 7 envs in use + 2 asked exceeds --max-envs 8; retry later"
        )
        assert first.admit("ipv4:10.0.0.3", 1) is None
        assert second.open_stream() == (
            "learner is full: 3 actors connected and 0 streams awaiting their Hello, "
            "--max-actors 3; retry later"
        )
        block.forget(0)  # holder 0 died: its two streams and five envs are free
        assert block.totals() == (1, 0, 3) and block.peer_envs("ipv4:10.0.0.1") == 0
        second.leave("ipv4:10.0.0.2", 3)
        assert block.totals() == (0, 0, 0) and not block.peer_key_P.any()
        assert second.admit("ipv4:10.0.0.1", 5) is None
    finally:
        for view in views:
            view.close()
        block.close()


def test_a_dead_frontends_counts_stay_in_the_sums_after_its_restart():
    block = FrontendCounters(2)
    other = FrontendCounters(2, block.name)
    try:
        stats = FrontendStats(other.row(1))
        stats.streams_rejected += 2
        stats.streams_invalid += 1
        assert block.sums() == {"streams_rejected": 2, "streams_timed_out": 0, "streams_invalid": 1}
        block.retire(1)
        restarted = FrontendStats(other.row(1))  # counts from zero
        restarted.streams_timed_out += 1
        assert block.sums() == {"streams_rejected": 2, "streams_timed_out": 1, "streams_invalid": 1}
        assert restarted.snapshot()["streams_timed_out"] == 1
        del stats, restarted  # their rows are views of the block
    finally:
        other.close()
        block.close()
    assert block.sums()["streams_rejected"] == 2  # the last read, once closed


def test_the_port_probe_passes_lingering_connections_and_refuses_a_listener(tmp_path):
    """A learner restarted on its port (after "trainer failed") finds the connections its
    frontends closed in TIME_WAIT there; only a listening socket means someone holds it."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()  # the server's side closes first: TIME_WAIT on the port
        client.close()
        with pytest.raises(OSError, match=r"could not bind the learner to 127\.0\.0\.1"):
            PortLock._probe("127.0.0.1", port)
    assert PortLock._probe("127.0.0.1", port) == port


# ---------------------------------------------------------------------- refusals


def test_what_the_tier_does_not_carry_is_refused_in_one_line():
    spec = describe_env("CartPole-v1")
    # Frontend 1's socket is the path and "-frontend-1": 21 bytes beside the name's own.
    config = LearnerConfig(serving_processes=2, bind="unix:/tmp/" + "x" * 87 + ".sock")
    refusal = (
        "--serving-processes 2 does not serve a unix --bind whose frontend sockets beside it "
        "exceed 107 bytes"
    )
    with pytest.raises(UnsupportedSetup, match=refusal):
        check_tier_supported(config, spec)
    check_tier_supported(replace(config, bind="unix:/tmp/" + "x" * 86 + ".sock"), spec)
    check_tier_supported(LearnerConfig(serving_processes=2), spec)


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


def test_the_frontends_serve_and_build_unrolls_without_torch(tier):
    """Only the model process runs the policy: a frontend that has served frames and built
    unrolls has mapped no torch library, whatever it imported or unpickled after spawn."""
    learner, _port, logdir = tier
    wait_until(lambda: _frames(logdir) >= 1000, 180, what="1000 frames")
    pids = {int(i): int(pid) for i, pid in STARTED.findall("\n".join(learner.lines))}
    assert sorted(pids) == [0, 1], learner.output()
    for index, pid in pids.items():
        with open(f"/proc/{pid}/maps") as maps:
            torch_maps = [line.split()[-1] for line in maps if "/torch/" in line]
        assert not torch_maps, f"frontend {index} mapped {torch_maps[:3]}"


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


@pytest.mark.long
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


# ------------------------------------------------------------ limits across frontends

LIMITS = ["--max-actors", "4", "--max-envs", "8", "--max-envs-per-peer", "7"]
TRIES = 8
"""Streams tried per phase, each on its own connection: the kernel spreads them over both
frontends (all on one: 2 in 2^8), so limits counted per frontend would admit more."""


OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


def _open_streams(port: int, spec, num_envs: int, tag: str):
    """(held streams, channels, refusals as (code, details)) of TRIES tries."""
    held, channels, refusals = [], [], []
    for i in range(TRIES):
        # Its own subchannel pool: its own TCP connection (gRPC shares them otherwise).
        channel = grpc.insecure_channel(f"127.0.0.1:{port}", OWN_CONNECTION)
        channels.append(channel)
        try:
            held.append(HeldStream(channel, spec, num_envs, actor_id=f"{tag}-{i}"))
        except grpc.RpcError as exc:
            refusals.append((exc.code(), exc.details()))
    return held, channels, refusals


def _close(held, channels, logdir) -> None:
    for stream in held:
        stream.close()
    for channel in channels:
        channel.close()
    wait_until(lambda: (r := read_records(logdir)) and r[-1]["actors_connected"] == 0, 60,
               what="every stream's place given back")  # fmt: skip


def test_limits_hold_across_frontends_and_their_counts_reach_the_learners_metrics(tmp_path):
    """N frontends admit exactly what one learner would, refusing with its messages; what
    they refuse and end shows in the model process's metrics under the usual names."""
    env = {"SEEDRL_LOG_LEVEL": "INFO"}
    extra = [*TIER, *LIMITS, "--no-train"]
    with learner_process(tmp_path, *extra, env=env, timeout=START_TIMEOUT_S) as (learner, port):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            spec = get_info(channel).env
        exhausted = grpc.StatusCode.RESOURCE_EXHAUSTED
        phases = [  # (K, admitted, the refusal's words)
            (1, 4, "learner is full: 4 actors connected and 0 streams awaiting their Hello, "
                   "--max-actors 4; retry later"),
            (3, 2, "learner is full: 6 envs in use + 3 asked exceeds --max-envs 8; retry later"),
            (2, 3, "peer ipv4:127.0.0.1 holds 6 envs + 2 asked exceeds --max-envs-per-peer 7; "
                   "retry later"),
        ]  # fmt: skip
        refused = 0
        for k, admitted, words in phases:
            held, channels, refusals = _open_streams(port, spec, k, f"k{k}")
            try:
                served_by = {int(i) for i in re.findall(rf"frontend (\d) .*'k{k}-\d+' connected",
                                                        "\n".join(learner.lines))}  # fmt: skip
                assert len(held) == admitted, (k, refusals, served_by)
                assert refusals == [(exhausted, words)] * (TRIES - admitted), refusals
            finally:
                _close(held, channels, tmp_path)
            refused += len(refusals)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            bad = frame(K, reward=np.ones(K, np.float64))
            assert act(channel, [hello(spec, K), bad]).code == INVALID
        last = wait_until(
            lambda: next((r for r in reversed(read_records(tmp_path)) if r["streams_invalid"]),
                         None), 30, what="the invalid stream in the metrics",
        )  # fmt: skip
        assert (last["streams_rejected"], last["streams_invalid"]) == (refused, 1), last
        assert last["serving_rss_mb/0"] > 0 and last["serving_rss_mb/1"] > 0, last


# ---------------------------------------------------------------------- multi-agent envs

TESTS_ENV = {
    "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT / "tests"), os.environ.get("PYTHONPATH"))))
}
"""What a learner and its actors need to build tests/multiagent_envs.py's envs."""


def _train_through_two_frontends(tmp_path, envs: int, *args: str):
    """A learner with two frontends and two actor processes of ``envs`` envs each, run to
    its end (``args``: its env and frames); the learner, once it exited cleanly with no
    traceback in any process."""
    extra = [*TIER, "--checkpoint-interval-s", "3600", *args]
    started = learner_process(tmp_path, *extra, env=TESTS_ENV, timeout=START_TIMEOUT_S)
    with started as (learner, port):
        allow = ["--allow-env-module", "multiagent_envs"]
        with running(actor_args(port, 2, envs, *allow), env=TESTS_ENV) as actors:
            code = learner.wait(240)
    assert code == 0, learner.output()
    assert not any("Traceback" in line for line in [*learner.lines, *actors.lines]), (
        learner.output()
    )
    return learner


@pytest.mark.long
def test_a_multi_agent_env_trains_through_two_frontends(tmp_path):
    """An AEC game whose agents take turns (so rows wait, and rewards arrive while they
    do) and one of which leaves early, from real actor processes through two frontends:
    the model tells the frontends which rows it recorded, and they train and end episodes."""
    learner = _train_through_two_frontends(
        tmp_path, 2, "--env", "multiagent_envs:turn_game", "--total-frames", "3000",
        "--unroll-length", "4", "--batch-size", "8",
    )  # fmt: skip
    assert "serving by 2 frontends" in learner.output()
    last = read_records(tmp_path)[-1]
    assert last["frames"] >= 3000 and last["learner_steps"] > 0, last
    assert last["episodes"] > 0 and last["episode_length_mean"] > 0, last


@pytest.mark.long
def test_self_play_trains_through_two_frontends_and_counts_each_game_once(tmp_path):
    """A two-player game by self-play through two frontends: new streams' envs start with no
    game under way, the model ends the learning seat's episodes and records each game in
    the league as one process does, and the frontends' episode counts do not add to it."""
    from learner.state import checkpoint

    learner = _train_through_two_frontends(
        tmp_path, 3, "--env", "multiagent_envs:two_player", "--self-play", "--snapshot-every",
        "3", "--total-frames", "1200", "--unroll-length", "4", "--batch-size", "4",
    )  # fmt: skip
    assert "serving by 2 frontends" in learner.output()
    assert any("win/draw/loss" in line for line in learner.lines), learner.output()
    last = read_records(tmp_path)[-1]
    assert last["learner_steps"] > 0 and "selfplay_win_rate" in last, last
    games = checkpoint.load(tmp_path / "checkpoint.pt")["self_play"]["ratings"]["games"]
    # The final record may count a last batch's games beyond the final checkpoint's (one a
    # env at most, as in one process); counted twice, the episodes would double.
    envs = 2 * 3
    assert 0 < games["learner"] <= last["episodes"] <= games["learner"] + envs, (last, games)


def test_the_multi_agent_conformance_cases_pass_against_two_frontends(tmp_path):
    """TurnProbe (three agents, a dict observation with an action mask) through the tier:
    acting rows are checked and answered, masked actions respected, bad acting refused."""
    extra = [*TIER, "--env", "seedrl.conformance.probe:TurnProbe", "--total-frames", "100000",
             "--no-train"]  # fmt: skip
    with learner_process(tmp_path, *extra, timeout=START_TIMEOUT_S) as (learner, port):
        cases = ("rejects-missing-agents", "rejects-bad-acting", "agent-actions-reply",
                 "actions-reply", "episode-ends-served", "rejects-bad-frame")  # fmt: skip
        report = run_learner_suite(f"127.0.0.1:{port}", LearnerSuiteConfig(only=",".join(cases)))
        assert "serving by 2 frontends" in learner.output()
    assert report.ok, report.text()
    assert not [v for v in report.verdicts if v.status is Status.SKIP], report.text()
    assert len(report.verdicts) == 6


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
