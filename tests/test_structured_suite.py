"""The structured suite's envs (benchmarks/learning/structured.py) keep the rewards, spaces
and levels the suite is read by: the scripted policy reaches each upper level exactly, a
uniformly random policy's mean sits within a few standard errors of the closed-form random
level, a seed replays an episode, and the suite and its heuristics load through the
benchmark's own machinery."""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from benchmarks.learning import structured
from benchmarks.learning.heuristics import HEURISTICS
from benchmarks.learning.runner import heuristic_return, random_return, uniform_action
from benchmarks.learning.suites import SUITES
from seedrl import envs

NAMES = sorted(structured.LEVELS)
RANDOM_EPISODES = 3000
STANDARD_ERRORS = 4.0


def _make(name: str) -> gym.Env[Any, Any]:
    return envs.make_env(structured.env_id(name))


def _returns(env: gym.Env[Any, Any], choose: Any, episodes: int, seed: int) -> list[float]:
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(choose(obs))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return returns


@pytest.mark.parametrize("name", NAMES)
def test_the_scripted_policy_reaches_the_upper_level_every_episode(name: str) -> None:
    levels = structured.LEVELS[name]
    returns = _returns(_make(name), levels.scripted, 200, seed=0)
    assert returns == [levels.upper] * 200


@pytest.mark.parametrize("name", NAMES)
def test_a_random_policy_averages_the_closed_form_random_level(name: str) -> None:
    env = _make(name)
    rng = np.random.default_rng(1)
    env.action_space.seed(1)
    returns = _returns(
        env, lambda obs: uniform_action(env.action_space, obs, rng), RANDOM_EPISODES, 7
    )
    level = structured.LEVELS[name].random
    stderr = max(float(np.std(returns)), 1e-9) / math.sqrt(len(returns))
    assert abs(float(np.mean(returns)) - level) < STANDARD_ERRORS * stderr


@pytest.mark.parametrize("name", NAMES)
def test_every_observation_is_in_the_declared_space(name: str) -> None:
    env = _make(name)
    rng = np.random.default_rng(2)
    for episode in range(20):
        obs, _ = env.reset(seed=episode)
        assert env.observation_space.contains(obs)
        done = False
        while not done:
            obs, _, terminated, truncated, _ = env.step(uniform_action(env.action_space, obs, rng))
            assert env.observation_space.contains(obs)
            done = terminated or truncated


def test_the_spaces_are_the_kinds_the_suite_is_about() -> None:
    spaces = gym.spaces
    lit = _make("lit_cell")
    assert isinstance(lit.observation_space, spaces.Dict)
    assert set(lit.observation_space.spaces) == {"image", "direction", "noise"}
    assert lit.observation_space["image"].shape == (1, 7, 7)
    assert lit.observation_space["direction"] == spaces.Discrete(4)
    assert lit.action_space == spaces.MultiDiscrete([7, 7])
    assert isinstance(_make("lit_cell_tuple").observation_space, spaces.Tuple)
    masked = _make("lit_cell_masked").observation_space
    assert isinstance(masked, spaces.Dict)
    assert masked["action_mask"] == spaces.MultiBinary(14)
    assert _make("combination_lock").action_space == spaces.MultiDiscrete([3, 4, 5])
    reg = _make("register")
    assert reg.action_space == spaces.Discrete(5) and isinstance(reg.observation_space, spaces.Dict)


def _episode(env: gym.Env[Any, Any], seed: int, actions_seed: int) -> list[Any]:
    env.action_space.seed(actions_seed)
    obs, _ = env.reset(seed=seed)
    seen: list[Any] = [gym.spaces.flatten(env.observation_space, obs)]
    done = False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        seen += [gym.spaces.flatten(env.observation_space, obs), reward]
        done = terminated or truncated
    return seen


def _same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("name", NAMES)
def test_a_seed_replays_the_episode_and_another_seed_does_not(name: str) -> None:
    first = _episode(_make(name), seed=5, actions_seed=9)
    assert _same(_episode(_make(name), seed=5, actions_seed=9), first)
    assert not _same(_episode(_make(name), seed=6, actions_seed=9), first)


def test_lit_cell_pays_only_when_both_sub_actions_are_right() -> None:
    env = _make("lit_cell")
    obs, _ = env.reset(seed=3)
    row, col = structured.lit_cell_action(obs)
    lit_row, lit_col = np.unravel_index(int(np.argmax(obs["image"])), (7, 7))
    assert row == lit_row and col == (lit_col + int(obs["direction"])) % 7
    for wrong in ([row, (col + 1) % 7], [(row + 1) % 7, col]):
        env.reset(seed=3)
        assert env.step(np.array(wrong))[1] == 0.0
    env.reset(seed=3)
    assert env.step(np.array([row, col]))[1] == 1.0


def test_a_masked_choice_earns_nothing_and_each_head_allows_three() -> None:
    env = _make("lit_cell_masked")
    obs, _ = env.reset(seed=4)
    mask = obs["action_mask"].reshape(2, 7)
    assert mask.sum(axis=1).tolist() == [3, 3]
    right = structured.lit_cell_action(obs)
    assert mask[0, right[0]] and mask[1, right[1]]
    masked_col = int(np.flatnonzero(mask[1] == 0)[0])
    assert env.step(np.array([right[0], masked_col]))[1] == 0.0


def test_the_register_pays_once_at_the_end_and_an_overwrite_loses_it() -> None:
    env = _make("register")
    obs, _ = env.reset(seed=8)
    cue = int(obs["cue"])
    rewards = [env.step(cue)[1]] + [env.step(structured.KEEP)[1] for _ in range(29)]
    assert rewards == [0.0] * 29 + [1.0]
    obs, _ = env.reset(seed=8)
    env.step(cue)
    env.step((cue + 1) % 4)  # overwritten at the second step: the cue is gone
    assert sum(float(env.step(structured.KEEP)[1]) for _ in range(28)) == 0.0


def test_uniform_action_samples_each_sub_action_among_its_allowed_ones() -> None:
    space = gym.spaces.MultiDiscrete([7, 7])
    mask = np.zeros(14, np.int8)
    mask[[1, 4, 5, 7 + 0, 7 + 6]] = 1
    rng = np.random.default_rng(0)
    drawn = {tuple(uniform_action(space, {"action_mask": mask}, rng)) for _ in range(300)}
    assert drawn == {(r, c) for r in (1, 4, 5) for c in (0, 6)}


def test_the_suite_holds_every_env_to_its_scripted_and_random_levels() -> None:
    suite = SUITES["structured"]
    assert [s.env for s in suite.envs] == [structured.env_id(n) for n in structured.LEVELS]
    assert (suite.num_actors, suite.envs_per_actor) == (2, 16)
    for spec in suite.envs:
        levels = structured.levels_of(spec.env)
        assert spec.preset is None  # the learner's defaults: what users' own envs start from
        assert spec.heuristic in HEURISTICS and spec.reference is None
        assert (spec.random_level, spec.upper_level) == (levels.random, levels.upper)
        assert levels.random < spec.thresholds[0] < spec.thresholds[-1] < levels.upper
        assert ":" not in spec.name  # a Markdown link would read it as a URL scheme
    assert SUITES["structured"].envs[0].random_level == pytest.approx(10 / 49)


def test_the_benchmark_scores_the_scripted_and_random_policies_on_a_suite_env() -> None:
    masked = next(s for s in SUITES["structured"].envs if s.env.endswith("lit_cell_masked"))
    scripted = heuristic_return(masked, 20, seed=100)
    assert scripted["mean"] == 10.0 and scripted["name"] == masked.heuristic
    rnd = random_return(masked, 400)
    assert abs(rnd["mean"] - 10 / 9) < STANDARD_ERRORS * rnd["std"] / math.sqrt(400)


def test_an_unknown_structured_name_is_refused() -> None:
    with pytest.raises(ValueError, match="no structured env"):
        structured.env_id("lit_cel")
    with pytest.raises(ValueError, match="not a structured env id"):
        structured.levels_of("CartPole-v1")
