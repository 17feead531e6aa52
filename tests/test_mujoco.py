"""MuJoCo robots as users run them: the family builds and steps gymnasium's v5 envs, and
the ``mujoco`` preset trains one through a real learner and real actor processes, with
observation and return normalisation on and actions inside the robot's bounds."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_families import train_briefly

from seedrl import envs
from seedrl.config import LearnerConfig
from seedrl.presets import build_config, load_preset

ROBOT = "Hopper-v5"
"""The cheapest of the suite's robots to step, with a 3-dimensional action."""


def _needs_mujoco() -> None:
    pytest.importorskip("mujoco", reason="mujoco not installed: pip install -e '.[mujoco]'")


def test_the_preset_normalises_what_robots_need():
    config = build_config(LearnerConfig, {}, load_preset("mujoco"))
    assert envs.family_of(config.env).name == "mujoco"
    assert config.normalize_observations and config.normalize_returns
    assert config.entropy_cost == 0.0


def test_a_robot_is_served_as_gymnasium_builds_it_and_actors_step_it():
    _needs_mujoco()
    spec = envs.describe_env(ROBOT)
    assert list(spec.observation_space.shape) == [11]
    assert spec.action_space.kind == "box" and list(spec.action_space.shape) == [3]
    vec = envs.make_vector_env(ROBOT, {}, 2)
    try:
        obs, _ = vec.reset(seed=0)
        assert obs.shape == (2, 11) and obs.dtype == np.float64
        obs, reward, *_ = vec.step(np.zeros((2, 3), np.float32))
        assert obs.shape == (2, 11) and reward.shape == (2,) and np.isfinite(reward).all()
    finally:
        vec.close()


@pytest.mark.long
def test_the_mujoco_preset_trains_a_robot_and_acts_within_its_bounds(tmp_path):
    _needs_mujoco()
    extra = [
        "--preset", "mujoco", "--env", ROBOT, "--total-frames", "2000",
        "--unroll-length", "16", "--batch-size", "4", "--updates-per-batch", "2",
    ]  # fmt: skip
    records, _ = train_briefly(tmp_path, extra, actors=1, envs_per_actor=4)
    assert records[-1]["frames"] >= 2000 and records[-1]["episodes"] > 0
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["env"] == ROBOT and config["normalize_observations"] is True
    from learner.tools.trained_policy import Policy

    policy = Policy.load(tmp_path / "checkpoint.pt")
    # The observation statistics were gathered from what the actors streamed: a Hopper
    # standing still has no spread in every joint, a stepped one has.
    assert policy.normalizer is not None and policy.normalizer.count >= 2000
    assert (policy.normalizer.var > 0).all()
    env = policy.make_env()
    obs, _ = env.reset(seed=0)
    policy.reset()
    for _ in range(5):
        action = policy.act(obs)
        assert action.shape == (3,) and np.all(np.abs(action) <= 1.0)
        obs, *_ = env.step(action)
    env.close()
