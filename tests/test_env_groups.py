"""Actor process options for throughput: ``--env-groups G`` (double buffering) and ``--nice``."""

from __future__ import annotations

import pytest
from support import actor_args, learner_process, read_records, running, wait_until

from seedrl.config import ActorConfig


def test_env_groups_must_divide_envs_per_actor():
    assert ActorConfig(envs_per_actor=8, env_groups=2).env_groups == 2
    for groups in (0, 3):
        with pytest.raises(ValueError, match="env_groups"):
            ActorConfig(envs_per_actor=8, env_groups=groups)


def test_one_actor_process_with_two_groups_opens_two_streams(tmp_path):
    with learner_process(tmp_path, "--total-frames", "4000") as (learner, port):
        with running(
            actor_args(port, 1, 4, "--env-groups", "2", "--max-backoff-s", "0.5")
        ) as actors:
            wait_until(
                lambda: any(r["actors_connected"] == 2 for r in read_records(tmp_path)),
                timeout=60,
                what="two streams from one actor process",
            )
            assert learner.wait(timeout=90) == 0, learner.output()
            assert actors.wait(timeout=30) == 0, actors.output()
    records = read_records(tmp_path)
    assert records[-1]["frames"] >= 4000
    assert max(r["actors_connected"] for r in records) == 2  # never more: one process


def test_actor_nice_is_bounded():
    assert ActorConfig(nice=10).nice == 10
    for bad in (-1, 20):
        with pytest.raises(ValueError, match="nice"):
            ActorConfig(nice=bad)
