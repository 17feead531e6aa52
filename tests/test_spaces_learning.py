"""Structured spaces end to end: a masked-action env with a dict observation, a
MultiDiscrete env and a dict-observation env learn with the learner's own parts
(seeded, deterministic), and train from ``python -m learner`` + ``python -m actors`` with
no wrapper, the dict-observation run's checkpoint resuming and evaluating.

The envs (tests/spaces_envs.py) raise on a masked action, so an actor that was sent one
would crash the run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from support import actor_args, learner_process, running

from learner.tools.synchronous import train_synchronously
from seedrl.config import LearnerConfig

TESTS = Path(__file__).resolve().parent
ENV = {"PYTHONPATH": os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)}
EPISODE_STEPS = 8  # spaces_envs.EPISODE_STEPS: the best return is 8, chance far below
FRAMES = 6_000


@pytest.fixture(autouse=True)
def _tests_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))


@pytest.mark.parametrize(
    ("env_id", "chance", "bar"),
    [
        ("spaces_envs:masked_choice", 2.7, 6.0),  # 1 / allowed actions per step: 8 * 0.33
        ("spaces_envs:multi_choice", 2.4, 4.0),  # 0.5 * (1/3 + 1/4) per step
        ("spaces_envs:dict_observation", 2.0, 6.0),  # 1/4 per step
        ("spaces_envs:dict_action", 3.3, 5.5),  # 0.5 / 3 + 2 * 0.25 / 2 per step
    ],
)
def test_structured_envs_learn(tmp_path, env_id: str, chance: float, bar: float) -> None:
    """From chance towards the best return of 8 in FRAMES frames, seeded (seed 0 ends at
    7.0, 4.9, 7.0 and 6.4: several choices at once learn more slowly)."""
    config = LearnerConfig(  # unbounded steps: the bound on each step halves a short run's pace
        logdir=str(tmp_path), env=env_id, seed=0, unroll_length=8, batch_size=8,
        max_queue_unrolls=64, max_update_kl=0,
    )  # fmt: skip
    curve = train_synchronously(config, num_envs=8, frames=FRAMES)
    (_, start), (_, end) = curve[0], curve[-1]
    assert start < chance + 1.5, f"a fresh policy should choose at random, got {start:.2f}"
    assert end > bar, f"{env_id}: no learning, {start:.2f} -> {end:.2f}"


def _train(tmp_path: Path, env_id: str, frames: int) -> tuple[int, list[str], list[str]]:
    args = ["--env", env_id, "--total-frames", str(frames), "--unroll-length", "8",
            "--batch-size", "8", "--checkpoint-interval-s", "3600"]  # fmt: skip
    with learner_process(tmp_path, *args, env=ENV, timeout=180) as (learner, port):
        with running(
            actor_args(port, 1, 4, "--allow-env-module", "spaces_envs"), env=ENV
        ) as actors:
            code = learner.wait(300)
            actors.wait(60)
    return code, learner.lines, actors.lines


@pytest.mark.parametrize(
    "env_id",
    # multi_choice learns in-process in test_structured_envs_learn; its run from the
    # commands is the same path as masked_choice's, so it runs with the slow tests.
    # dict_action's replies are checked in-process (test_spaces), so its run is slow too.
    [
        "spaces_envs:masked_choice",
        pytest.param("spaces_envs:multi_choice", marks=pytest.mark.slow),
        pytest.param("spaces_envs:dict_action", marks=pytest.mark.slow),
    ],
)
def test_structured_envs_train_from_the_commands(tmp_path, env_id: str) -> None:
    code, learner_log, actor_log = _train(tmp_path, env_id, 2_000)
    assert code == 0, "\n".join(learner_log[-30:])
    assert not any("Traceback" in line or "masked action" in line for line in actor_log), "\n".join(
        actor_log[-30:]
    )
    assert (tmp_path / "checkpoint.pt").exists()


def test_a_dict_observation_checkpoint_resumes_and_evaluates(tmp_path) -> None:
    from learner.parts import build_learner
    from learner.state import checkpoint
    from learner.tools.trained_policy import Policy

    code, learner_log, _ = _train(tmp_path, "spaces_envs:masked_choice", 2_000)
    assert code == 0, "\n".join(learner_log[-30:])
    path = tmp_path / "checkpoint.pt"
    saved = checkpoint.load(path)
    resumed = build_learner(
        LearnerConfig(logdir=str(tmp_path), env="spaces_envs:masked_choice", resume=True)
    )
    assert resumed.stats.frames >= 2_000
    for name, tensor in resumed.model.state_dict().items():
        torch.testing.assert_close(tensor, saved["model"][name], msg=name)
    for greedy in (True, False):
        policy = Policy.load(path, greedy=greedy)
        env = policy.make_env()
        obs, _ = env.reset(seed=1)
        for _ in range(3 * EPISODE_STEPS):  # the env raises on a masked action
            action = policy.act(obs)
            assert obs["action_mask"][action]
            obs, _, terminated, _, _ = env.step(action)
            if terminated:
                policy.reset()
                obs, _ = env.reset()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--model", "mlp"], "--model mlp reads one observation tensor"),
    ],
)
def test_unsupported_combinations_stop_the_learner_with_one_line(tmp_path, extra, message):
    result = subprocess.run(
        [sys.executable, "-m", "learner", "--env", "spaces_envs:masked_choice",
         "--logdir", str(tmp_path), *extra],
        env={**os.environ, **ENV}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_structured_observations_carry_every_leaf_unchanged() -> None:
    """The packed rows the learner stores unpack to the env's own values."""
    import spaces_envs

    from seedrl import codec, envs

    vec = envs.make_vector_env("spaces_envs:dict_observation", {}, 3)
    try:
        obs, _ = vec.reset(seed=0)
        spec = codec.space_to_spec(spaces_envs.DictObservation().observation_space)
        packing = codec.LeafPacking(codec.space_leaves(spec))
        rows = packing.pack_values(codec.flatten_values(spec, obs))
        for value, leaf in zip(packing.unpack(rows), codec.space_leaves(spec), strict=True):
            np.testing.assert_array_equal(value, obs[leaf.name])
    finally:
        vec.close()
