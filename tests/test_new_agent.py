"""A new algorithm is one agent package and one registry entry: the REINFORCE agent of
:mod:`agents_reinforce`, registered here at test time and nowhere else, trains CartPole
through the real learner (actor processes on loopback, the thread and the process
trainer hosts) and beats a random policy measured here."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import pytest
from agents_reinforce import ReinforceAgent, ReinforceOptions

import learner
from learner.agents import registry

RANDOM_EPISODES = 200
BEAT_RANDOM_BY = 4.0
"""The mean-100 return a trained policy must reach, as a multiple of a random one's."""
MAX_SECONDS = 45.0


@pytest.fixture
def reinforce_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one entry a new agent needs: its factory and its options under its ``--agent``
    name (the config learns the name and the knobs from the registry)."""
    entry = registry.Registered(ReinforceAgent, ReinforceOptions)
    monkeypatch.setitem(registry.AGENTS, ReinforceAgent.name, entry)


def random_return_mean() -> float:
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(0)
    returns = []
    for episode in range(RANDOM_EPISODES):
        env.reset(seed=episode)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(int(rng.integers(2)))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return float(np.mean(returns))


@pytest.mark.long
@pytest.mark.parametrize("trainer", ["thread", "process"])
def test_a_registered_reinforce_agent_learns_cartpole_on_a_real_host(
    tmp_path, reinforce_registered, trainer
) -> None:
    bar = BEAT_RANDOM_BY * random_return_mean()
    began = time.monotonic()
    result = learner.train(
        "CartPole-v1", num_actors=1, envs_per_actor=8, logdir=tmp_path / "run",
        agent="reinforce", trainer=trainer, device="cpu", unroll_length=32, batch_size=8,
        learning_rate=3e-3, hidden_sizes=(32,), reinforce_entropy_bonus=0.01, target_return=bar,
        max_seconds=MAX_SECONDS,
    )  # fmt: skip
    elapsed = time.monotonic() - began
    assert result.learner_steps > 0
    assert result.episode_return_mean is not None and result.episode_return_mean >= bar, (
        f"{trainer} host: mean return {result.episode_return_mean} after {result.frames} "
        f"frames, {elapsed:.0f} s; a random policy's times {BEAT_RANDOM_BY} is {bar:.1f}"
    )
    assert elapsed < MAX_SECONDS + 30
    assert result.policy.act(result.policy.make_env().reset(seed=0)[0]) in (0, 1)
