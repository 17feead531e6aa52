"""Actor process options for throughput: ``--env-groups G`` (double buffering) and ``--nice``.

Several groups streaming from one process: tests/test_actor_threads.py."""

from __future__ import annotations

import pytest

from seedrl.config import ActorConfig


def test_env_groups_must_divide_envs_per_actor():
    assert ActorConfig(envs_per_actor=8, env_groups=2).env_groups == 2
    for groups in (0, 3):
        with pytest.raises(ValueError, match="--env-groups"):
            ActorConfig(envs_per_actor=8, env_groups=groups)


def test_actor_nice_is_bounded():
    assert ActorConfig(nice=10).nice == 10
    for bad in (-1, 20):
        with pytest.raises(ValueError, match="nice"):
            ActorConfig(nice=bad)
