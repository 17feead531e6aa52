"""The actor shape a learner's preset wants reaches the actors: GetInfo carries the envs
per actor, an actor given no --envs-per-actor of its own steps that many, and its own
flag wins."""

from __future__ import annotations

import threading

import pytest

from actors.actor import Actor
from seedrl.config import ActorConfig
from seedrl.presets import load_preset
from tests.support import learner_process

ADVISED = 32


@pytest.fixture(scope="module")
def advising_learner(tmp_path_factory):
    """A learner that trains nothing and advises its actors 32 envs each."""
    logdir = tmp_path_factory.mktemp("advising")
    config = logdir / "advice.toml"
    config.write_text(f'env = "CartPole-v1"\nactor_envs_per_actor = {ADVISED}\n')
    with learner_process(logdir, "--config", str(config), "--no-train") as (_, port):
        yield port


def _run_actor(port: int, **flags: int) -> Actor:
    """One actor in this process, for two frames' worth of its K envs."""
    k = flags.get("envs_per_actor", ADVISED)
    config = ActorConfig(learner=f"127.0.0.1:{port}", max_frames=2 * k, **flags)
    actor = Actor(config, index=0)
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(actor.run()), daemon=True)
    thread.start()
    thread.join(60)
    if thread.is_alive():
        actor.stop()
        thread.join(10)
        raise AssertionError("the actor did not finish its frames within 60 s")
    assert result == [0]
    return actor


def test_an_actor_without_its_own_k_steps_the_learners_advice(advising_learner, caplog):
    caplog.set_level("INFO", logger="actors.actor")
    actor = _run_actor(advising_learner)
    assert actor.num_envs == ADVISED
    assert actor.frames == 2 * ADVISED  # two messages of 32 envs each
    assert f"{ADVISED} envs (the learner's advice)" in caplog.text


def test_the_actors_own_flag_wins_over_the_advice(advising_learner, caplog):
    caplog.set_level("INFO", logger="actors.actor")
    actor = _run_actor(advising_learner, envs_per_actor=3)
    assert actor.num_envs == 3
    assert actor.frames == 6
    assert "3 envs (--envs-per-actor)" in caplog.text


@pytest.mark.parametrize(
    ("preset", "k"), [("connect4", 256), ("minatar", 16), ("atari", 8), ("mujoco", 8)]
)
def test_the_measured_presets_name_the_k_they_were_measured_with(preset, k):
    assert load_preset(preset)["actor_envs_per_actor"] == k


def test_env_groups_need_a_k_of_their_own():
    """G groups split K before any learner is asked: without --envs-per-actor, refused."""
    with pytest.raises(ValueError, match="--env-groups needs --envs-per-actor"):
        ActorConfig(env_groups=2)
