"""One benchmark run: the project's own ``learner.train`` (learner + actor processes) to a
frame budget, then the final score from ``learner.tools.evaluate``.

Run as ``python -m benchmarks.learning.runner`` by the suite driver, one process per run,
so a run's torch threads, frozen heap and child actors end with it. A run whose
``run.json`` is missing is unfinished: started again, it resumes from its checkpoint.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from benchmarks.learning.heuristics import HEURISTICS
from benchmarks.learning.suites import SUITES, EnvSpec, Suite
from seedrl.envs.agents import AgentChooser, AgentEnvs, AgentsEnv, play_episode

RUN_FILE = "run.json"
"""Written last, once training reached its budget and the evaluation finished."""
RANDOM_FILE = "random.json"
INTERRUPTED = 130
"""Exit status of a run stopped by a signal before it finished (it resumes next time)."""
RANDOM_MAX_STEPS = 27_000
"""Cap per random episode (Atari's 108 k-frame limit at frame skip 4)."""


def find_env(suite: Suite, name: str) -> EnvSpec:
    """The suite's env called ``name`` (its run directory name first, then its env id)."""
    for spec in (*[s for s in suite.envs if s.name == name], *suite.envs):
        if name in (spec.env, spec.name):
            return spec
    raise ValueError(f"{name!r} is not in suite {suite.name}")


def finished_run(logdir: Path, frames: int) -> dict[str, Any] | None:
    """The run's record when it finished with at least ``frames`` frames, else None."""
    path = logdir / RUN_FILE
    if not path.exists():
        return None
    record: dict[str, Any] = json.loads(path.read_text())
    return record if record["budget_frames"] >= frames else None


def run_overrides(spec: EnvSpec, overrides: dict[str, Any] | None) -> dict[str, Any]:
    """The learner fields a benchmark run sets on top of its preset.

    A run trains to its frame budget: a preset's ``target_return`` (Pendulum's) would end
    it early and leave it unfinished, and the thresholds the summary reports are read off
    the curve instead. ``--set target_return=...`` still applies.
    """
    kwargs = {"env_kwargs": dict(spec.env_kwargs)} if spec.env_kwargs else {}
    return {"target_return": None, **kwargs, **spec.overrides, **(overrides or {})}


def train_and_evaluate(
    suite: Suite,
    spec: EnvSpec,
    seed: int,
    frames: int,
    logdir: Path,
    eval_episodes: int,
    num_actors: int,
    envs_per_actor: int,
    overrides: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """Train (resuming a checkpoint in ``logdir``), evaluate, write ``run.json``.

    Returns None when training stopped short of the budget (a signal): the run stays
    unfinished and the next call resumes it.
    """
    import torch

    import learner
    from learner.tools.evaluate import evaluate
    from learner.tools.trained_policy import Policy

    result = learner.train(
        spec.env,
        preset=spec.preset,
        total_frames=frames,
        seed=seed,
        logdir=logdir,
        num_actors=num_actors,
        envs_per_actor=envs_per_actor,
        resume=True,
        tensorboard=False,
        **run_overrides(spec, overrides),
    )
    if result.frames < frames:
        print(f"stopped at {result.frames} of {frames} frames: {result.reason}", flush=True)
        return None
    policy = Policy.load(result.checkpoint, greedy=suite.greedy)
    torch.manual_seed(seed)
    eval_seed = 1_000_000 + 1000 * seed
    scores: dict[str, Any] | None = None
    baseline: dict[str, Any] = {}
    if spec.opponents:
        baseline = chosen_matches(spec, logdir, policy, eval_episodes, eval_seed, suite.greedy)
    else:
        scores = evaluate(policy, eval_episodes, seed=eval_seed).to_dict()
    if spec.heuristic:  # the same episodes (env seeds) as the policy's evaluation
        baseline["heuristic"] = heuristic_return(spec, eval_episodes, eval_seed)
    record = {
        "env": spec.env,
        "env_kwargs": dict(spec.env_kwargs),
        "seed": seed,
        "budget_frames": frames,
        "overrides": dict(overrides or {}),
        "frames": result.frames,
        "actors": [num_actors, envs_per_actor],
        "learner_steps": result.learner_steps,
        "episodes": result.episodes,
        "train_return_mean100": result.episode_return_mean,
        "eval": scores,
        **baseline,
    }
    (logdir / RUN_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return record


def chosen_matches(
    spec: EnvSpec, logdir: Path, final: Any, games: int, seed: int, greedy: bool
) -> dict[str, Any]:
    """The games the verdict is on, those of the run's best checkpoint (in self-play with
    fixed opponents it is chosen by the training games against them, so these games are
    fresh to it), and the final weights' beside them; the final weights' alone where the
    run kept no best."""
    from learner.state.checkpoint import BEST_FILE
    from learner.tools.trained_policy import Policy

    final_games = matches(spec, final, games, seed)
    if not (logdir / BEST_FILE).exists():
        return {"matches": final_games, "matches_of": "final"}
    best = Policy.load(logdir / BEST_FILE, greedy=greedy)
    assert best.checkpoint_info is not None  # Policy.load always says where from
    return {
        "matches": matches(spec, best, games, seed),
        "matches_of": "best",
        "best_frames": best.checkpoint_info.frames,
        "final_matches": final_games,
    }


def matches(spec: EnvSpec, policy: Any, games: int, seed: int) -> list[dict[str, Any]]:
    """The policy's games against each of ``spec.opponents`` as first and second player
    (``learner.league.arena``, as ``python -m learner evaluate --opponent`` plays them)."""
    from learner.league import arena, opponents

    env = arena.make_aec_env(spec.env, spec.env_kwargs)
    played = []
    try:
        for name in spec.opponents:
            opponent = arena.ScriptedPlayer(opponents.build(name, spec.env, seed + 1))
            result = arena.play_match(env, policy, opponent, games, name, seed)
            played.append(result.to_dict())
    finally:
        env.close()
    return played


def agents_return(
    spec: EnvSpec, choose: AgentChooser, episodes: int, seed: int = 0
) -> dict[str, Any]:
    """A multi-agent env's episodes from seeds ``seed``, ``seed + 1``, ... with ``choose``
    playing every agent: the per-agent return (each episode's mean over agents of their
    returns, as ``evaluate`` reports a shared policy's) and the team's (their sum)."""
    from seedrl import envs

    env = envs.make_env(spec.env, spec.env_kwargs)
    if not isinstance(env, AgentsEnv):
        env.close()
        raise ValueError(f"{spec.env}: agents' baselines need a multi-agent env")
    rows = AgentEnvs(spec.env, [lambda: env.env])
    try:
        played = [
            play_episode(rows, choose, seed + episode, RANDOM_MAX_STEPS)
            for episode in range(episodes)
        ]
    finally:
        rows.close()
    means = [e.agent_mean for e in played]
    teams = [e.team for e in played]
    return {
        "mean": float(np.mean(means)),
        "std": float(np.std(means)),
        "episodes": episodes,
        "agents": len(rows.agent_ids),
        "team_mean": float(np.mean(teams)),
    }


def heuristic_return(spec: EnvSpec, episodes: int, seed: int) -> dict[str, Any]:
    """The env's scripted baseline (``spec.heuristic``) on episodes from env seed ``seed``."""
    from seedrl import envs

    choose = HEURISTICS[spec.heuristic]
    env = envs.make_env(spec.env, spec.env_kwargs)
    if isinstance(env, AgentsEnv):
        env.close()
        return {"name": spec.heuristic, **agents_return(spec, choose, episodes, seed)}
    played = episodes_return(env, lambda obs: choose(0, obs), episodes, seed)
    return {"name": spec.heuristic, **played}


def uniform_action(space: gym.Space[Any], obs: Any, rng: np.random.Generator) -> Any:
    """A uniformly random action: among the allowed ones where the observation carries an
    ``action_mask`` (for a ``MultiDiscrete`` action, one mask segment per sub-action)."""
    if not (isinstance(obs, dict) and "action_mask" in obs):
        return space.sample()
    mask = np.asarray(obs["action_mask"]).reshape(-1)
    if isinstance(space, gym.spaces.MultiDiscrete):
        segments = np.split(mask, np.cumsum(space.nvec.reshape(-1))[:-1])
        choice = [rng.choice(np.flatnonzero(segment)) for segment in segments]
        return np.array(choice, space.dtype).reshape(space.shape)
    return rng.choice(np.flatnonzero(mask))


def episodes_return(
    env: gym.Env[Any, Any], choose: Callable[[Any], Any], episodes: int, seed: int
) -> dict[str, Any]:
    """Mean and std of a single-agent env's return over full episodes from env seeds
    ``seed``, ``seed + 1``, ..., with ``choose`` (observation -> action) acting; closes it."""
    returns = []
    try:
        for episode in range(episodes):
            obs, _ = env.reset(seed=seed + episode)
            total, steps, done = 0.0, 0, False
            while not done and steps < RANDOM_MAX_STEPS:
                obs, reward, terminated, truncated, _ = env.step(choose(obs))
                total += float(reward)
                steps += 1
                done = terminated or truncated
            returns.append(total)
    finally:
        env.close()
    return {"mean": float(np.mean(returns)), "std": float(np.std(returns)), "episodes": episodes}


def random_return(spec: EnvSpec, episodes: int, seed: int = 0) -> dict[str, Any]:
    """Mean and std of a uniformly random policy's return on the same env, full episodes
    (uniform over the allowed actions where the observation carries an action mask); in
    a multi-agent env every agent plays at random and the return is the per-agent one."""
    from seedrl import envs

    env = envs.make_env(spec.env, spec.env_kwargs)
    env.action_space.seed(seed)
    rng = np.random.default_rng(seed)
    if isinstance(env, AgentsEnv):
        env.close()

        def uniform(row: int, obs: Any) -> Any:
            if isinstance(obs, dict) and "action_mask" in obs:
                return rng.choice(np.flatnonzero(obs["action_mask"]))
            return env.action_space.sample()

        return agents_return(spec, uniform, episodes, seed)
    space = env.action_space
    return episodes_return(env, lambda obs: uniform_action(space, obs, rng), episodes, seed)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.learning.runner")
    parser.add_argument("--suite", required=True, choices=sorted(SUITES))
    parser.add_argument("--env", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--frames", type=int, required=True)
    parser.add_argument("--logdir", required=True)
    parser.add_argument("--eval-episodes", type=int, required=True)
    parser.add_argument("--num-actors", type=int, required=True)
    parser.add_argument("--envs-per-actor", type=int, required=True)
    parser.add_argument("--overrides", default="{}", help="JSON object of LearnerConfig fields")
    args = parser.parse_args(argv)
    suite = SUITES[args.suite]
    spec = find_env(suite, args.env)
    try:
        record = train_and_evaluate(
            suite, spec, args.seed, args.frames, Path(args.logdir), args.eval_episodes,
            args.num_actors, args.envs_per_actor, json.loads(args.overrides),
        )  # fmt: skip
    except KeyboardInterrupt:  # during the evaluation: the next call evaluates again
        record = None
    return 0 if record is not None else INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
