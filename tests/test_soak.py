"""The soak's verdict (``benchmarks.soak.report``) on recorded runs made up here: each
bound holds on a run that keeps it and breaks on one that does not, and the docs block
renders from the JSON alone. The soak itself runs as ``make soak-short`` in CI."""

from __future__ import annotations

import random
import socket

import pytest

from benchmarks.soak import cluster, report
from benchmarks.soak.run import KINDS, Soak, SoakConfig


def samples(values: list[float], key: str = "learner_total_mb") -> list[dict[str, float]]:
    return [{"t": float(10 * i), key: v} for i, v in enumerate(values)]


def test_rss_growth_after_warmup_is_held_to_slack_plus_share():
    flat = samples([300.0] * 3 + [500.0] * 20 + [520.0] * 20)  # the ramp is warm-up
    check = report.rss_growth(flat, "learner_total_mb", warmup_s=30)
    assert check["ok"] and check["first_mb"] == 500 and check["last_mb"] == 520
    assert check["bound_mb"] == report.RSS_SLACK_MB + report.RSS_SLACK_SHARE * 500
    leak = samples([500.0 + 3 * i for i in range(40)])  # +117 MB over the run
    check = report.rss_growth(leak, "learner_total_mb", warmup_s=0)
    assert not check["ok"] and check["growth_mb"] > check["bound_mb"]
    # A learner that is down (0 MB between a kill and its restart) is not a drop to judge.
    gaps = samples([500.0] * 10 + [0.0] * 5 + [505.0] * 10)
    assert report.rss_growth(gaps, "learner_total_mb", warmup_s=0)["ok"]


def record(t: float, connected: int, **extra: float) -> dict[str, float]:
    return {"time": t, "actors_connected": connected, **extra}


def test_a_stream_held_past_the_keepalive_is_stuck():
    ok = [record(t, 6) for t in range(10)] + [record(10 + t, 7) for t in range(15)]
    assert report.stuck_streams([*ok, record(30, 6)], 6)["ok"]
    stuck = [record(t, 7) for t in range(25)] + [record(30, 6)]
    check = report.stuck_streams(stuck, 6)
    assert not check["ok"] and check["longest_excess_s"] == 24
    # Ending with an actor missing is broken too.
    assert not report.stuck_streams([record(0, 6), record(1, 5)], 6)["ok"]


def test_checkpoints_must_load_and_never_go_back():
    good = [{"checkpoint_frames": 100, "checkpoint_ok": True}, {"checkpoint_frames": 300}]
    assert report.checkpoints(good, 400)["ok"]
    assert not report.checkpoints(good, None)["ok"]  # no final checkpoint
    back = [{"checkpoint_frames": 300}, {"checkpoint_frames": 100}]
    assert not report.checkpoints(back, 400)["ok"]
    failed = [{"checkpoint_frames": 100, "checkpoint_ok": False}]
    assert not report.checkpoints(failed, 400)["ok"]


def test_return_must_be_solved_or_above_its_value_after_warmup():
    rising = [{"time": 100.0 + t, "episode_return_mean": 20.0 + t} for t in range(100)]
    assert report.returns(rising, warmup_s=10, started_wall=100.0)["ok"]
    falling = [{"time": 100.0 + t, "episode_return_mean": 200.0 - t} for t in range(100)]
    assert not report.returns(falling, warmup_s=10, started_wall=100.0)["ok"]
    solved_dip = [*rising[:5], {"time": 200.0, "episode_return_mean": 480.0}]
    assert report.returns(solved_dip, warmup_s=0, started_wall=100.0)["solved"]


def fault(kind: str, ok: bool = True) -> dict[str, object]:
    return {
        "kind": kind, "t_s": 1.0, "recovery_s": 2.0, "recovery_bound_s": 60.0,
        "frames_lost": 10, "frames_lost_bound": 168, "ok": ok, "checkpoint_frames": 100,
    }  # fmt: skip


def result(faults: list[dict[str, object]]) -> dict[str, object]:
    records = [
        record(1000.0 + t, 6, episode_return_mean=20.0 + t, frames=1000 * t, fps=1000.0)
        for t in range(60)
    ]
    rss = [{"t": float(t), "learner_total_mb": 500.0, "actors_mb": 300.0} for t in range(0, 60, 5)]
    return {
        "date": "2026-01-01", "command": "python -m benchmarks.soak --short",
        "machine": {"cpu_model": "cpu", "cpus": 2, "python": "3.11"},
        "config": {**SoakConfig(warmup_s=10).__dict__}, "actors": 6, "started_wall": 1000.0,
        "stopped_wall": 1059.5, "duration_s": 60.0, "skipped": {"partition": "not root"},
        "faults": faults, "rss": rss, "records": records, "final_checkpoint_frames": 500,
    }  # fmt: skip


def test_the_verdict_and_the_docs_block_follow_the_faults():
    good = result([fault(kind) for kind in KINDS])
    checks = report.judge(good)
    assert all(c["ok"] for c in checks.values()), checks
    good.update(checks=checks, ok=True)
    block = report.render(good, "reliability/soak.png")
    assert "all bounds held" in block and "partition not run: not root" in block
    assert "| actor_kill | 1 | 2.0 / 2.0 | 60 | 10 | 168 | yes |" in block
    assert "![soak: RSS, return and faults](reliability/soak.png)" in block
    bad = result([fault("actor_kill"), fault("failover", ok=False)])
    checks = report.judge(bad)
    assert not checks["faults_within_bounds"]["ok"]
    assert checks["faults_within_bounds"]["broken"] == ["failover at 1.0 s"]


def test_a_fault_is_within_bounds_only_when_recovered_in_time_and_losing_no_more():
    soak = Soak.__new__(Soak)  # only its bookkeeping: no cluster
    soak.faults, soak.started = [], 0.0
    soak.say = lambda line: None
    base = {"recovery_bound_s": 60.0, "frames_lost_bound": 168}
    assert soak.record("actor_kill", 0.0, recovery_s=5.0, frames_lost=160, **base)["ok"]
    assert not soak.record("actor_kill", 0.0, recovery_s=61.0, frames_lost=0, **base)["ok"]
    assert not soak.record("actor_kill", 0.0, recovery_s=5.0, frames_lost=169, **base)["ok"]
    assert not soak.record("actor_kill", 0.0, recovery_s=None, frames_lost=0, **base)["ok"]
    assert not soak.record(
        "disk_full", 0.0, recovery_s=5.0, frames_lost=0, checkpoint_ok=False, **base
    )["ok"]
    assert not soak.record(
        "connection_flood", 0.0, recovery_s=5.0, frames_lost=0, health_ok=False, **base
    )["ok"]
    # A frontend's kill: the same learner lives on and the frontend comes back.
    killed = {"recovery_s": 5.0, "frames_lost": 0, **base}
    assert soak.record("frontend_kill", 0.0, learner_survived=True, frontend_restarted=True,
                       **killed)["ok"]  # fmt: skip
    assert not soak.record("frontend_kill", 0.0, learner_survived=False,
                           frontend_restarted=True, **killed)["ok"]  # fmt: skip
    assert not soak.record("frontend_kill", 0.0, learner_survived=True,
                           frontend_restarted=False, **killed)["ok"]  # fmt: skip


def test_the_connection_flood_counts_what_the_server_closed_and_stays_on_this_host():
    with socket.create_server(("127.0.0.1", 0)) as server:
        place = f"127.0.0.1:{server.getsockname()[1]}"
        flood = cluster.IdleFlood(place, 3)
        try:
            accepted = [server.accept()[0] for _ in range(3)]
            assert flood.poll(0.1) == 0  # held open, nothing sent either way
            accepted[0].close()
            accepted[1].sendall(b"settings")  # bytes first, then the close
            accepted[1].close()
            for _ in range(20):
                if flood.poll(0.1) == 2:
                    break
            assert flood.closed == 2
            accepted[2].close()
        finally:
            flood.close()
    with pytest.raises(RuntimeError, match="stays on this host"):
        cluster.IdleFlood("192.0.2.1:8686", 1)  # TEST-NET-1: never this host's


def test_the_frontend_kill_picks_the_frontend_serving_the_most_streams():
    """Streams counted from the learner's log since each frontend's last start: a
    restarted frontend's old streams are gone."""
    soak = Soak.__new__(Soak)
    soak.rng = random.Random(0)
    served = "INFO frontend {} learner.serving.servicer: actor '{}' {}"
    log = "\n".join([
        "INFO learner.serving.tier: serving frontend 0 (pid 10) on port 1",
        "INFO learner.serving.tier: serving frontend 1 (pid 11) on port 1",
        *(served.format(0, f"a{i}", "connected from x") for i in range(3)),
        served.format(1, "b", "connected from x"),
        served.format(1, "c", "connected from x"),
        "WARNING learner.serving.tier: serving frontend 0 died (exit code -9): its 3 streams ended",
        "INFO learner.serving.tier: serving frontend 0 (pid 12) on port 1",
        served.format(0, "a0", "connected from x"),
        served.format(1, "b", "disconnected after 9 frames"),
        served.format(1, "d", "connected from x"),
    ])  # fmt: skip
    assert soak.busiest_frontend(log, [0, 1]) == 1  # 2 streams against the restarted one's 1
