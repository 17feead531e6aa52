"""Cooperative multi-agent envs played by one shared policy: ``evaluate`` puts the policy in
every agent's seat and reports per-agent and team returns; the learning benchmark scores
its random and scripted baselines over all agents the same way; MPE2 is an env family;
the ``multiagent`` suite holds simple_spread to its heuristic."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from multiagent_envs import JoinLeave

from benchmarks.learning import heuristics, report
from benchmarks.learning.runner import RUN_FILE, agents_return, random_return
from benchmarks.learning.suites import SUITES
from learner.agents.models import action_head, build_model, choose_torso
from learner.state import checkpoint
from learner.tools import evaluate
from learner.tools.trained_policy import Policy
from seedrl import codec, envs
from seedrl.config import LearnerConfig, to_json_dict
from seedrl.envs.agents import AgentEnvs, play_episode

JOIN_LEAVE = "multiagent_envs:JoinLeave"


def test_an_episode_of_every_agent_sums_each_agents_own_rewards():
    # JoinLeave: a plays steps 1-5, c steps 1-3, b joins at 2 and plays 3-5; each live
    # agent's reward is its action plus the step number. Action 1 for everyone:
    # a = 5 + 15, b = 3 + 12, c = 3 + 6.
    rows = AgentEnvs(JOIN_LEAVE, [JoinLeave])
    played = play_episode(rows, lambda row, obs: 1, seed=0, max_steps=100)
    np.testing.assert_array_equal(played.returns, [20.0, 15.0, 9.0])
    assert (played.steps, played.ended) == (5, True)
    assert played.agent_mean == pytest.approx(44 / 3) and played.team == 44.0
    cut = play_episode(rows, lambda row, obs: 1, seed=0, max_steps=2)
    np.testing.assert_array_equal(cut.returns, [3.0 + 2, 0.0, 3.0 + 2])
    assert (cut.steps, cut.ended) == (2, False)


def test_the_benchmarks_baselines_score_every_agent_per_agent_and_as_a_team(monkeypatch):
    spec = SUITES["multiagent"].envs[0]
    spec = type(spec)(JOIN_LEAVE, 10, None, (0.0,), preset=None, heuristic="always-2")
    monkeypatch.setitem(heuristics.HEURISTICS, "always-2", lambda row, obs: 2)
    monkeypatch.setattr(envs, "check_env_allowed", lambda *a, **k: None)
    got = agents_return(spec, heuristics.HEURISTICS["always-2"], episodes=3, seed=7)
    # action 2: a = 10 + 15, b = 6 + 12, c = 6 + 6, every episode alike
    assert got["mean"] == pytest.approx(55 / 3) and got["std"] == pytest.approx(0.0)
    assert got["team_mean"] == pytest.approx(55.0)
    assert (got["agents"], got["episodes"]) == (3, 3)
    # At random every agent plays too: between all playing 0 (a 15, b 12, c 6) and all 3
    # (a 30, b 21, c 15) per agent, the same for the same seed.
    rnd = random_return(spec, episodes=4, seed=3)
    assert 11.0 < rnd["mean"] < 22.0 and rnd["team_mean"] == pytest.approx(3 * rnd["mean"])
    assert rnd == random_return(spec, episodes=4, seed=3) and rnd["agents"] == 3


def _checkpoint(path: Path, env_id: str, env: object, seed: int = 0) -> Path:
    """An untrained shared policy for a multi-agent env, saved as a learner checkpoint."""
    agent = env.possible_agents[0]  # type: ignore[attr-defined]
    spec = codec.env_spec(
        env_id,
        {},
        env.observation_space(agent),
        env.action_space(agent),  # type: ignore[attr-defined]
    )
    config = LearnerConfig()
    head = action_head(spec.action_space, masked=False)
    torch.manual_seed(seed)
    torso = choose_torso(spec.observation_space, config.model)
    model = build_model(spec.observation_space, head, torso, config.hidden_sizes)
    training = checkpoint.TrainingState(model.state_dict(), {}, 1)
    state = checkpoint.snapshot(
        training,
        frames=0,
        config=to_json_dict(config),
        env_spec=spec.SerializeToString(),
        model_spec=to_json_dict(model.spec),
    )
    checkpoint.save(path, state)
    return path


def test_evaluate_puts_the_policy_in_every_agents_seat(tmp_path, capsys):
    path = _checkpoint(tmp_path / "checkpoint.pt", JOIN_LEAVE, JoinLeave())
    policy = Policy.load(path)
    # What each agent earns, from the greedy actions the policy picks on the observations
    # JoinLeave shows it ([step, agent index]): a acts at steps 0-4, b at 2-4, c at 0-2.
    act = Policy.load(path)
    act.reset()

    def earned(index: int, steps: range) -> float:
        return sum(act.act(np.array([t, index], np.float32)) + t + 1 for t in steps)

    a, b, c = earned(0, range(5)), earned(1, range(2, 5)), earned(2, range(3))
    result = evaluate.evaluate_shared(policy, envs.make_env(JOIN_LEAVE), episodes=2)
    assert result.returns == pytest.approx([(a + b + c) / 3] * 2)
    assert result.team_returns == pytest.approx([a + b + c] * 2)
    assert (result.agents, result.lengths, result.truncated) == (3, [5, 5], 0)
    assert result.to_dict()["team_mean"] == pytest.approx(a + b + c)

    assert evaluate.main(["--checkpoint", str(path), "--episodes", "2",
                          "--allow-env-module", "multiagent_envs"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert f"team return (sum over agents) {a + b + c:.2f} +- 0.00" in out
    assert f"per-agent mean return {(a + b + c) / 3:.2f} +- 0.00 over 2 full episodes" in out


def test_mpe2_is_a_family_and_its_missing_extra_is_named(monkeypatch):
    pytest.importorskip("mpe2")
    assert envs.family_of("mpe2.simple_spread_v3").name == "mpe"
    assert envs.family_of("pettingzoo.mpe.simple_spread_v3").name == "pettingzoo"
    spec = envs.describe_env("mpe2.simple_spread_v3", {"N": 2})
    assert list(spec.agents) == ["agent_0", "agent_1"]
    assert tuple(spec.observation_space.shape) == (12,)
    for bad, said in (
        ("mpe2.no_such_env_v1", "mpe2.no_such_env_v1: no such MPE2 env"),
        ("mpe2.simple_spread", "mpe2.simple_spread: not an MPE2 env id (mpe2.<env>_v<N>"),
    ):
        with pytest.raises(envs.EnvError, match=re.escape(said)):
            envs.make_env(bad)
    monkeypatch.setitem(sys.modules, "mpe2", None)  # as if mpe2 were not installed
    for build in (envs.make_env, lambda i: envs.make_vector_env(i, {}, 2), envs.describe_env):
        with pytest.raises(envs.EnvError, match=re.escape("pip install 'seedrl[mpe]'")):
            build("mpe2.simple_spread_v3")


def _spread_obs(vel, landmarks, others):  # type: ignore[no-untyped-def]
    """An agent's simple_spread observation: velocity, own position (unused), the landmarks'
    and the other agents' positions relative to it, communication (zeros)."""
    parts = [vel, [0.3, -0.2], *landmarks, *others, [0.0] * (2 * len(others))]
    return np.concatenate([np.asarray(p, np.float32) for p in parts])


def test_the_spread_heuristic_heads_for_its_landmark_of_the_best_assignment():
    # Landmarks right of this agent (1, 0), above the other two (-1, 1.1), (1, 1.1); the
    # others stand at (-1, 1) and (1, 1). Best assignment: each other agent to the landmark
    # 0.1 above it, this agent to (1, 0) (total 1.2), though (1, 0) is not its nearest...
    landmarks = [[1.0, 0.0], [-1.0, 1.1], [1.0, 1.1]]
    others = [[-1.0, 1.0], [1.0, 1.0]]
    still = _spread_obs([0.0, 0.0], landmarks, others)
    assert heuristics.spread_assignment(*heuristics.spread_layout(still)[1:]) == (0, 1, 2)
    assert heuristics.spread_action(still) == heuristics.RIGHT
    # ...moving right at 3 per step it would coast 1.2 (dt / damping = 0.4 of it): brake.
    assert heuristics.spread_action(_spread_obs([3.0, 0.0], landmarks, others)) == heuristics.LEFT
    # Its landmark 0.05 above where it would coast to: close enough, no push.
    near = [[0.0, 0.05], [-1.0, 1.1], [1.0, 1.1]]
    assert heuristics.spread_action(_spread_obs([0.0, 0.0], near, others)) == heuristics.NOOP
    # The other agents see the same geometry from where they stand and take their own parts:
    # the agent at (1, 1) sees this one at (-1, -1) and its own landmark 0.1 above it.
    theirs = _spread_obs([0.0, 0.0], [[0.0, -1.0], [-2.0, 0.1], [0.0, 0.1]],
                         [[-1.0, -1.0], [-2.0, 0.0]])  # fmt: skip
    _, agents_N2, landmarks_N2 = heuristics.spread_layout(theirs)
    assert heuristics.spread_assignment(agents_N2, landmarks_N2) == (2, 0, 1)
    assert heuristics.spread_action(theirs) == heuristics.UP  # 0.1 away: not yet close enough


def test_the_multiagent_suite_holds_simple_spread_to_its_heuristic(tmp_path):
    suite = SUITES["multiagent"]
    (spread,) = suite.envs
    assert (spread.env, spread.preset, spread.heuristic) == (
        "mpe2.simple_spread_v3",
        "spread",
        "spread",
    )
    assert spread.reference is None and spread.heuristic in heuristics.HEURISTICS
    assert envs.family_of(spread.env).preset == "spread"
    with pytest.raises(ValueError, match="give a reference, a heuristic or opponents"):
        type(spread)(spread.env, 10, None, (0.0,))
    # A finished run's heuristic, scored on its evaluation episodes, is the verdict's bar.
    seed_dir = tmp_path / spread.name / "seed0"
    seed_dir.mkdir(parents=True)
    (seed_dir / "metrics.jsonl").write_text(
        json.dumps({"elapsed_s": 60.0, "frames": 30_000, "episode_return_mean": -13.0}) + "\n"
    )
    run = {"seed": 0, "frames": 30_000, "budget_frames": 30_000, "train_return_mean100": -13.0,
           "eval": {"mean": -12.5, "std": 2.0, "episodes": 4, "returns": [], "lengths": [],
                    "team_returns": [], "team_mean": -37.5},
           "heuristic": {"name": "spread", "mean": -9.0, "std": 3.0, "episodes": 4}}  # fmt: skip
    (seed_dir / RUN_FILE).write_text(json.dumps(run))
    (tmp_path / spread.name / "random.json").write_text(json.dumps({"mean": -27.0, "std": 7.0}))
    summary = report.write_summary(suite, tmp_path)
    assert summary["envs"][0]["meets_reference"] is False
    assert "team_returns" not in summary["envs"][0]["runs"][0]["eval"]
    table = report.markdown_table(summary)
    row = next(r for r in table.splitlines() if r.startswith("| mpe2.simple_spread_v3 | 1 |"))
    assert "| -27.0 | -9.0 ± 3.0 | heuristic -9.00 | no (short by 3.5) |" in row
    assert "| mpe2.simple_spread_v3 | - | none in this env's reward convention" in table
