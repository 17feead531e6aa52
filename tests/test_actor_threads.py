"""Several actors in one process: how the launcher splits N actors, and actor threads."""

from __future__ import annotations

import re
import threading

import pytest
from support import actor_args, learner_process, read_records, running, wait_until

from actors.launcher import Launcher, process_config
from actors.placement import PROCESSES_PER_CPU, actor_process_sizes
from actors.process import ActorThread
from seedrl.commands import actors_command
from seedrl.config import ActorConfig


@pytest.mark.parametrize(
    ("actors", "per_process", "cpus", "sizes"),
    [
        (3, 0, 2, [1, 1, 1]),  # few actors: one process each
        (8, 0, 2, [1] * 8),
        (64, 0, 2, [8] * 8),  # many: PROCESSES_PER_CPU processes per CPU share them
        (10, 0, 2, [2, 2] + [1] * 6),
        (256, 0, 1, [64] * 4),
        (10, 4, 2, [4, 3, 3]),  # at most 4 a process, spread evenly
        (10, 1, 2, [1] * 10),  # the literal one process per actor
        (2, 8, 2, [2]),
    ],
)
def test_actors_are_spread_evenly_over_processes(actors, per_process, cpus, sizes):
    assert PROCESSES_PER_CPU == 4
    assert actor_process_sizes(actors, per_process, cpus) == sizes


def test_actors_per_process_must_not_be_negative():
    with pytest.raises(ValueError, match="--actors-per-process must be >= 0"):
        ActorConfig(actors_per_process=-1)


def test_each_process_gets_its_first_index_and_count(monkeypatch):
    config = ActorConfig(num_actors=10, actors_per_process=4, first_index=20, restart=False)
    spawned: list[int] = []
    monkeypatch.setattr(Launcher, "_spawn", lambda self, index: spawned.append(index))
    launcher = Launcher(config)
    launcher.start()
    assert spawned == [20, 24, 27]
    assert [launcher._sizes[i] for i in spawned] == [4, 3, 3]

    child = process_config(config, 24, count=3)
    assert (child.first_index, child.num_actors, child.cpu) == (24, 3, -1)
    args = actors_command(child, "actor")
    assert args[args.index("--first-index") + 1] == "24"
    assert args[args.index("--num-actors") + 1] == "3"
    assert "--actors-per-process" not in args and "--pin-cpus" not in args
    assert "--no-restart" in args  # threads in the process restart (or not) as asked


class FakeActor:
    """Crashes on its first life (when asked to), then runs until stopped or returns 0."""

    def __init__(self, lives: list[FakeActor], crash: bool, block: bool = False) -> None:
        self.actor_id = f"fake-{len(lives)}"
        self.crash = crash
        self.block = block
        self.stopped = threading.Event()
        lives.append(self)

    def run(self) -> int:
        if self.crash:
            raise RuntimeError("env exploded")
        if self.block:
            self.stopped.wait(30)
        return 0

    def stop(self) -> None:
        self.stopped.set()


def test_a_crashed_actor_thread_starts_a_fresh_actor():
    lives: list[FakeActor] = []
    thread = ActorThread(lambda: FakeActor(lives, crash=not lives), restart=True, name="t")
    thread.start()
    thread.join(timeout=10)  # the first restart waits 0.5 s
    assert not thread.is_alive()
    assert (len(lives), thread.crashes, thread.code) == (2, 1, 0)


def test_without_restart_a_crash_ends_the_thread_with_1():
    lives: list[FakeActor] = []
    thread = ActorThread(lambda: FakeActor(lives, crash=True), restart=False, name="t")
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert (len(lives), thread.crashes, thread.code) == (1, 1, 1)


def test_stop_ends_a_running_actor_and_a_pending_restart():
    lives: list[FakeActor] = []
    running_thread = ActorThread(lambda: FakeActor(lives, False, block=True), True, name="a")
    running_thread.start()
    crashed: list[FakeActor] = []
    restarting = ActorThread(lambda: FakeActor(crashed, crash=True), restart=True, name="b")
    restarting.start()
    wait_until(lambda: restarting.crashes == 1, 10, what="the first crash")
    for thread in (running_thread, restarting):
        thread.stop()
        thread.join(timeout=10)
        assert not thread.is_alive()
    assert running_thread.code == 0 and lives[0].stopped.is_set()
    assert len(crashed) == 1  # stopped during its wait: no fresh actor


@pytest.mark.long
def test_two_actors_of_two_env_groups_share_one_process(tmp_path):
    """--actors-per-process 2 --env-groups 2: one process, four streams (actor i's group g
    is index 2i + g) of K / G envs each, and the run finishes cleanly."""
    info_logs = {"SEEDRL_LOG_LEVEL": "INFO"}  # the learner logs each actor that connects
    with learner_process(tmp_path, "--total-frames", "4000", env=info_logs) as (learner, port):
        args = actor_args(
            port, 2, 4, "--actors-per-process", "2", "--env-groups", "2", "--max-backoff-s", "0.5"
        )
        with running(args) as actors:
            wait_until(
                lambda: any(r["actors_connected"] == 4 for r in read_records(tmp_path)),
                timeout=60,
                what="four streams from one actor process",
            )
            assert learner.wait(timeout=90) == 0, learner.output()
            assert actors.wait(timeout=30) == 0, actors.output()
    assert "2 actors x 4 envs in 1 processes" in actors.output()
    records = read_records(tmp_path)
    assert records[-1]["frames"] >= 4000
    assert max(r["actors_connected"] for r in records) == 4
    # The learner logs "actor 'HOST-PID-INDEX' connected ... with K envs".
    connected = re.findall(
        r"actor '[^']+-(\d+)-(\d+)' connected .* with (\d+) envs", learner.output()
    )
    assert len({pid for pid, _, _ in connected}) == 1, learner.output()
    assert sorted(int(index) for _, index, _ in connected) == [0, 1, 2, 3]
    assert {envs for _, _, envs in connected} == {"2"}
