"""Fail-over to a standby learner: the standby's watch, the leader file, the actors' turn.

The end-to-end test kills a primary learner with SIGKILL on loopback and checks that
the standby (``--standby``) takes over from the shared checkpoint and the actors
(``--fallback-learner``) follow it; then the old primary, restarted in place with
``--resume``, waits as the new leader's standby instead of training beside it. A primary
training a population hands the standby every member, its values and the exploit history.
"""

from __future__ import annotations

import json
import signal
import threading
import time

import pytest
from support import free_port, learner_args, read_records, running, wait_until

from actors.actor import Actor
from learner import failover
from learner.parts import build_learner, make_checkpointer, make_trainer, save_checkpoint
from learner.population.pbt import EVENT_KEY, POPULATION_KEY
from learner.state import checkpoint, files
from learner.training.hosts import ThreadHost
from seedrl.commands import actors_command
from seedrl.config import ActorConfig, LearnerConfig

INFO = {"SEEDRL_LOG_LEVEL": "INFO"}


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def scripted(answers: list[bool]):
    """A health check answering from ``answers`` in turn, then the last one for ever."""
    asked: list[str] = []

    def ask(address: str) -> tuple[bool, str]:
        asked.append(address)
        ok = answers[min(len(asked), len(answers)) - 1]
        return ok, "SERVING" if ok else "UNAVAILABLE: connection refused"

    return ask, asked


def test_standby_takes_over_only_after_the_leader_served_then_fell_silent_for_the_grace(
    tmp_path,
):
    config = LearnerConfig(logdir=str(tmp_path), standby="10.0.0.1:1", standby_grace_s=3.0)
    # Not up yet for longer than the grace (a standby started first must not take over),
    # then serving for 4 polls, then silent.
    ask, asked = scripted([False] * 10 + [True] * 4 + [False])
    clock = FakeClock()
    assert failover.wait_to_lead(config, ask, clock, clock.sleep)
    last_ok = 13 * failover.POLL_S  # the 14th poll was the last answer
    assert clock.now - last_ok >= config.standby_grace_s
    assert clock.now - last_ok < config.standby_grace_s + failover.POLL_S
    assert set(asked) == {"10.0.0.1:1"}


def test_standby_stands_down_when_the_run_ended_for_good(tmp_path):
    config = LearnerConfig(logdir=str(tmp_path), standby="10.0.0.1:1", standby_grace_s=1.0)

    def ask(address: str) -> tuple[bool, str]:
        if clock.now >= 2.0 and not (tmp_path / "result.json").exists():
            (tmp_path / "result.json").write_text(json.dumps({"reason": "done", "final": True}))
        return clock.now < 2.0, "NOT_SERVING"

    clock = FakeClock()
    assert not failover.wait_to_lead(config, ask, clock, clock.sleep)


def test_a_restart_of_the_run_is_not_a_reason_to_stand_down(tmp_path):
    (tmp_path / "result.json").write_text(json.dumps({"reason": "signal", "final": False}))
    assert not failover.finished_since(tmp_path, 0.0)
    (tmp_path / "result.json").write_text(json.dumps({"reason": "done", "final": True}))
    assert failover.finished_since(tmp_path, 0.0)
    assert not failover.finished_since(tmp_path, time.time() + 60)  # an older run's result


def test_a_resumed_learner_waits_as_standby_of_a_live_leader(tmp_path):
    failover.write_leader(tmp_path, failover.Leader("other", "127.0.0.1:9"))
    config = LearnerConfig(logdir=str(tmp_path), resume=True, port=7, standby_grace_s=1.0)
    ask, asked = scripted([True, True, False])
    identified: list[str] = []

    def the_leader(address: str) -> str:
        identified.append(address)
        return "other"

    turn = failover.standby_turn(config, ask, the_leader)
    assert turn is not None and turn.resume and turn.standby == ""
    assert identified == ["127.0.0.1:9"] and asked[0] == "127.0.0.1:9"
    # Its own address in the file (a restart in place), a dead leader, or another learner
    # that took the leader's port since: serve at once.
    alive = scripted([True])[0]
    failover.write_leader(tmp_path, failover.Leader("old", failover.own_address(config)))
    assert failover.standby_turn(config, alive, lambda address: "old") == config
    failover.write_leader(tmp_path, failover.Leader("other", "127.0.0.1:9"))
    assert failover.standby_turn(config, alive, lambda address: None) == config
    assert failover.standby_turn(config, alive, lambda address: "a stranger") == config


def test_a_learner_learns_it_was_superseded_from_the_leader_file(tmp_path):
    fence = failover.Fence(tmp_path, failover.Leader("me", "127.0.0.1:1"))
    assert failover.read_leader(tmp_path) == failover.Leader("me", "127.0.0.1:1")
    assert fence.superseded() is None and not fence.lost
    time.sleep(0.01)  # a distinct mtime
    failover.write_leader(tmp_path, failover.Leader("standby", "127.0.0.1:2"))
    assert fence.superseded() == failover.Leader("standby", "127.0.0.1:2")
    assert fence.lost


def test_a_superseded_writer_never_replaces_the_leaders_checkpoint(tmp_path):
    """The fence is read right before each rename, under the directory's lock: a primary
    that has not yet noticed the takeover (it looks once per log interval) renames nothing."""
    target = tmp_path / "checkpoint.pt"
    primary = failover.Fence(tmp_path, failover.Leader("primary", "127.0.0.1:1"))
    standby = failover.Fence(tmp_path, failover.Leader("standby", "127.0.0.1:2"))
    checkpoint.save(target, {"frames": 2000}, standby)
    leaders = target.read_bytes()
    with pytest.raises(files.NotOwner, match=r"127\.0\.0\.1:2 took over"):
        with files.atomic_file(target, primary) as f:
            f.write(b"the primary's stale weights")
    assert target.read_bytes() == leaders
    assert [p.name for p in tmp_path.glob(".checkpoint.pt.tmp-*")] == []
    assert primary.lost and primary.superseded() == standby.own
    assert not standby.lost


def test_a_superseded_learner_writes_neither_checkpoint_nor_history(tmp_path, caplog):
    config = LearnerConfig(
        logdir=str(tmp_path), tensorboard=False, progress="off", checkpoint_history_frames=10
    )
    learner = build_learner(config)
    learner.lease = failover.Fence(tmp_path, failover.Leader("primary", "127.0.0.1:1"))
    save_checkpoint(learner)
    failover.write_leader(tmp_path, failover.Leader("standby", "127.0.0.1:2"))
    (tmp_path / "checkpoint.pt").unlink()
    (tmp_path / "checkpoints" / "frames-0.pt").unlink()
    learner.stats.frames = 50
    host = ThreadHost(make_trainer(learner), learner.queue, learner.stats)
    assert not make_checkpointer(learner, host.training_state).save()
    assert "took over" in caplog.text
    assert not config.checkpoint_path.exists() and not any(tmp_path.glob("checkpoints/*"))


def test_leader_json_cannot_change_while_a_leader_renames(tmp_path):
    """A takeover waits for the leader's rename in flight: the look at leader.json and the
    rename are one step for anyone who writes leader.json."""
    primary = failover.Fence(tmp_path, failover.Leader("primary", "127.0.0.1:1"))
    takeover = threading.Thread(
        target=failover.write_leader,
        args=(tmp_path, failover.Leader("standby", "127.0.0.1:2")),
    )
    with primary.held():
        takeover.start()
        takeover.join(0.5)
        assert failover.read_leader(tmp_path) == primary.own
    takeover.join(10)
    assert not takeover.is_alive()
    assert failover.read_leader(tmp_path) == failover.Leader("standby", "127.0.0.1:2")


def test_actor_fails_over_in_turn_only_when_the_learner_is_gone():
    config = ActorConfig(learner="127.0.0.1:1", fallback_learner="127.0.0.1:2, 127.0.0.1:3")
    actor = Actor(config, index=0)
    assert actor.addresses == ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]
    homes = []
    for _ in range(4):
        actor._fail_over("gone", 20)
        homes.append(actor.home)
    assert homes == ["127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:1", "127.0.0.1:2"]
    alone = Actor(ActorConfig(learner="127.0.0.1:1"), index=0)
    alone._fail_over("gone", 20)
    assert alone.home == "127.0.0.1:1"


def frames_of(records: list[dict], learner_run_start: int) -> int:
    return int(records[-1]["frames"]) if len(records) > learner_run_start else 0


# CI runs the same fail-over end to end in `make soak-short` (.ci/run), judged against
# its bounds; this standalone copy runs with the slow tests.
@pytest.mark.slow
def test_standby_takes_over_when_the_primary_is_killed_and_actors_follow(tmp_path):
    """SIGKILL the primary: the standby resumes from its checkpoint within seconds, the
    actors fail over to it, and the primary restarted in place waits as its standby."""
    primary_port, standby_port = free_port(), free_port()
    common = ("--checkpoint-interval-s", "1", "--standby-grace-s", "2")
    primary = learner_args(primary_port, tmp_path, *common)
    standby = learner_args(
        standby_port, tmp_path, *common, "--standby", f"127.0.0.1:{primary_port}"
    )
    actor_config = ActorConfig(
        learner=f"127.0.0.1:{primary_port}", fallback_learner=f"127.0.0.1:{standby_port}",
        num_actors=2, envs_per_actor=4, max_backoff_s=0.5,
    )  # fmt: skip
    with running(primary, env=INFO) as first, running(standby, env=INFO) as second:
        first.wait_for("listening on", 60)
        second.wait_for(f"the leader at 127.0.0.1:{primary_port} serves", 60)
        with running(actors_command(actor_config), env=INFO) as actors:
            wait_until(
                lambda: (r := read_records(tmp_path)) and r[-1]["learner_steps"] >= 20,
                90, what="the primary to train",
            )  # fmt: skip
            wait_until(lambda: (tmp_path / "checkpoint.pt").exists(), 30, what="a checkpoint")
            before = len(read_records(tmp_path))
            killed_at = time.monotonic()
            first.popen.send_signal(signal.SIGKILL)
            first.popen.wait(10)
            second.wait_for("stopped answering", 30)
            noticed_s = time.monotonic() - killed_at
            second.wait_for("listening on", 60)
            took_over_s = time.monotonic() - killed_at
            # Noticing takes the grace; serving again, a learner's start (the trainer
            # process imports torch), which a loaded CI machine stretches.
            assert noticed_s < 2 + 10, second.output()
            # The standby's records: actors back on it, training on from the checkpoint.
            wait_until(
                lambda: (
                    len(r := read_records(tmp_path)) > before
                    and r[-1]["actors_connected"] == 2
                    and r[-1]["learner_steps"] > r[before]["learner_steps"]
                ),
                60, what="the actors on the standby and training going on",
            )  # fmt: skip
            resumed = read_records(tmp_path)[before]
            assert resumed["learner_steps"] > 0, "the standby started over instead of resuming"
            assert failover.read_leader(tmp_path).address == f"127.0.0.1:{standby_port}"
            # The old primary, restarted in place, finds the standby leading and waits.
            with running([*primary, "--resume"], env=INFO) as again:
                again.wait_for(f"watching the leader at 127.0.0.1:{standby_port}", 60)
                time.sleep(3)
                assert "listening on" not in "\n".join(again.lines)
    assert took_over_s < 90
    assert "failing over to 127.0.0.1:" in actors.output() or any(
        "failing over" in line for line in actors.lines
    ), actors.output()


def _member_steps(record: dict, members: list[str]) -> list[int]:
    return [int(record.get(f"policy/{name}/learner_steps", 0)) for name in members]


# Beside the fail-over above, with the slow tests: two learner starts and a population
# trained to its first exploits take longer than the quick suite allows.
@pytest.mark.slow
def test_a_population_fails_over_with_its_members_values_and_history(tmp_path):
    """SIGKILL a primary training ``--population 2`` after an exploit reached its
    checkpoint: the standby resumes both members (each at the values and own step count
    the checkpoint holds) and the exploit history, the actors follow it, both members
    train on, and the standby's history goes on from the checkpoint's."""
    members = ["member0", "member1"]
    primary_port, standby_port = free_port(), free_port()
    common = (
        "--checkpoint-interval-s", "1", "--standby-grace-s", "2", "--population", "2",
        "--pbt-interval", "500", "--pbt-fraction", "0.5", "--unroll-length", "8",
        "--batch-size", "8", "--seed", "3",
    )  # fmt: skip
    primary = learner_args(primary_port, tmp_path, *common)
    standby = learner_args(
        standby_port, tmp_path, *common, "--standby", f"127.0.0.1:{primary_port}"
    )
    actor_config = ActorConfig(
        learner=f"127.0.0.1:{primary_port}", fallback_learner=f"127.0.0.1:{standby_port}",
        num_actors=2, envs_per_actor=4, max_backoff_s=0.5,
    )  # fmt: skip
    path = tmp_path / "checkpoint.pt"

    def exploited() -> bool:  # an exploit the primary has checkpointed
        try:
            return bool(checkpoint.load(path)[POPULATION_KEY]["history"])
        except (checkpoint.CheckpointError, KeyError):
            return False

    with running(primary, env=INFO) as first, running(standby, env=INFO) as second:
        first.wait_for("listening on", 60)
        second.wait_for(f"the leader at 127.0.0.1:{primary_port} serves", 60)
        with running(actors_command(actor_config), env=INFO) as actors:
            wait_until(exploited, 120, what="an exploit in the primary's checkpoint")
            first.popen.send_signal(signal.SIGKILL)
            first.popen.wait(10)
            # Nothing writes the checkpoint now until the standby has taken over.
            saved = checkpoint.load(path)
            before = len(read_records(tmp_path))
            second.wait_for("stopped answering", 30)
            second.wait_for("listening on", 60)
            steps = [int(saved[checkpoint.POLICIES][name]["learner_steps"]) for name in members]
            wait_until(
                lambda: (
                    len(r := read_records(tmp_path)) > before
                    and r[-1]["actors_connected"] == 2
                    and all(
                        now > then
                        for now, then in zip(_member_steps(r[-1], members), steps, strict=True)
                    )
                ),
                90, what="the actors on the standby and both members training on",
            )  # fmt: skip
            assert failover.read_leader(tmp_path).address == f"127.0.0.1:{standby_port}"
        assert second.stop() is not None  # SIGTERM: the standby writes its last checkpoint
    assert "failing over to 127.0.0.1:" in actors.output(), actors.output()
    assert f"resumed from {path} at frame {saved['frames']}" in second.output()
    records = read_records(tmp_path)[before:]
    population = saved[POPULATION_KEY]
    # Each member's values as the standby first logged them are the checkpoint's (or, for a
    # member that copied in that interval, the values its first exploit replaced).
    first_record = records[0]
    assert first_record["frames"] >= saved["frames"], "the standby started over"
    resumed_steps = _member_steps(first_record, members)
    assert all(now >= then for now, then in zip(resumed_steps, steps, strict=True)), (
        resumed_steps, steps,
    )  # fmt: skip
    exploited_first = {e["member"]: e for e in first_record.get(EVENT_KEY, [])}
    for name, values in zip(members, population["values"], strict=True):
        if name in exploited_first:
            assert exploited_first[name]["old_values"] == values
        else:
            shown = {k: first_record[f"pbt/{name}/{k}"] for k in values}
            assert shown == values
    assert first_record["pbt/exploits"] >= len(population["history"])
    # The standby's history: the checkpoint's, then the exploits it logged itself.
    final = checkpoint.load(path)[POPULATION_KEY]
    events = [event for record in records for event in record.get(EVENT_KEY, [])]
    assert final["history"] == population["history"] + events
    assert final["names"] == members
