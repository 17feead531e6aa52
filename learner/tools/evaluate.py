"""``python -m learner evaluate``: run a trained policy from a checkpoint, in process.

A checkpoint carries the env spec (id, kwargs, spaces) and the model spec, so the
network and the env are rebuilt exactly as they were trained, with no other flags
(:class:`learner.agents.trained_policy.Policy`, the same object notebooks use). A
checkpoint is a file from anywhere, so a ``module:callable`` env it names is built only
when this command's user allows that module (``--allow-env-module``) or names the env
(``--env``).

A multi-agent env (PettingZoo, MPE2) without ``--opponent`` is played by the policy in
every agent's seat, as a shared policy trains (cooperative games such as MPE's
``simple_spread``): the return reported is the per-agent one, each episode's mean over
agents of the agent's summed rewards, with the team's (the sum over agents) beside it.

With ``--opponent`` (two-player PettingZoo games such as Connect Four) the policy plays
``--games`` games as the first player and as many as the second against a scripted
opponent (random, heuristic), another checkpoint or a ``module:callable`` of the user's,
and win / draw / loss rates are printed per seat (:mod:`learner.league.arena`).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from learner.agents.trained_policy import Policy
from learner.population.pbt import add_member_argument
from learner.state import checkpoint, dataset
from seedrl import codec, envs
from seedrl.envs.agents import AgentEnvs, AgentsEnv, play_episode
from seedrl.proto import seedrl_pb2 as pb


@dataclasses.dataclass
class EvalResult:
    """Returns of full episodes, reported as users report them: mean +- std over N."""

    returns: list[float]
    lengths: list[int]
    video: str | None = None
    greedy: bool = True
    """Actions were the policy's most likely ones (else sampled from it)."""
    truncated: int = 0
    """Episodes cut at ``max_steps`` before the game ended (their return is partial)."""
    agents: int = 1
    """Agents the policy played in each episode; with several, ``returns`` are per-agent
    (each episode's mean over agents of the agent's return)."""
    team_returns: list[float] | None = None
    """With several agents: each episode's sum over agents of their returns."""

    @property
    def mean(self) -> float:
        return float(np.mean(self.returns))

    @property
    def std(self) -> float:
        """Population std of the episode returns (0 for a single episode)."""
        return float(np.std(self.returns)) if len(self.returns) > 1 else 0.0

    def summary(self) -> str:
        mode = "greedy" if self.greedy else "sampled"
        cut = f", {self.truncated} cut at the step cap" if self.truncated else ""
        what = "mean return"
        if self.team_returns is not None:
            what = (
                f"{self.agents} agents, one shared policy; team return (sum over agents) "
                f"{np.mean(self.team_returns):.2f} +- {np.std(self.team_returns):.2f}; "
                "per-agent mean return"
            )
        return (
            f"{what} {self.mean:.2f} +- {self.std:.2f} over {len(self.returns)} full "
            f"episodes ({mode}{cut}; min {min(self.returns):.2f}, max {max(self.returns):.2f}, "
            f"mean length {np.mean(self.lengths):.1f})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "mean": self.mean,
            "std": self.std,
            "episodes": len(self.returns),
            "greedy": self.greedy,
            "truncated": self.truncated,
            "returns": list(self.returns),
            "lengths": list(self.lengths),
            **(
                {}
                if self.team_returns is None
                else {
                    "agents": self.agents,
                    "return": "per-agent: each episode's mean over agents of their returns",
                    "team_mean": float(np.mean(self.team_returns)),
                    "team_returns": list(self.team_returns),
                }
            ),
        }


def evaluation_env(policy: Policy, render_mode: str | None = None) -> Any:
    """The training env, but scored the way the family's results are published
    (:attr:`seedrl.envs.EnvFamily.evaluation_kwargs`; Atari: an episode is a full game,
    all lives, whatever ``episodic_life`` the policy was trained with; sticky actions and
    the 108 k-frame cap stay as configured)."""
    kwargs = envs.evaluation_kwargs(policy.env_id, policy.env_kwargs)
    return envs.make_env(policy.env_id, kwargs, render_mode=render_mode)


def evaluate(
    policy: Policy,
    episodes: int,
    seed: int = 0,
    max_steps: int = 100_000,
    video: str | Path | None = None,
    record_dataset: str | Path | None = None,
) -> EvalResult:
    """Run ``episodes`` full episodes with the policy's mode (greedy or sampled; seed torch
    for repeatable samples); record the first one's frames to ``video`` if given, and
    every episode to a Minari dataset at ``record_dataset`` if given."""
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    if record_dataset is not None:  # refused before anything is played or written
        dataset.refuse_unsupported(policy.env_spec)
        dataset.dataset_target(record_dataset)
    env = evaluation_env(policy, render_mode="rgb_array" if video else None)
    if isinstance(env, AgentsEnv):
        return evaluate_shared(policy, env, episodes, seed, max_steps, video)
    writer = None
    if record_dataset is not None:
        mode = "greedy" if policy.greedy else "sampled"
        writer = dataset.DatasetWriter(record_dataset, env, policy.env_spec, f"seedrl {mode}")
    frames: list[np.ndarray] = []
    returns: list[float] = []
    lengths: list[int] = []
    truncated_by_cap = 0
    try:
        for episode in range(episodes):
            obs, _ = env.reset(seed=seed + episode)
            policy.reset()
            total, steps, ended = 0.0, 0, False
            recording = video is not None and episode == 0
            steps_seen = _Steps(obs) if writer is not None else None
            while steps < max_steps and not ended:
                if recording:
                    frames.append(np.asarray(env.render()))
                action = policy.act(obs)
                obs, reward, terminated, truncated, _ = env.step(action)
                if steps_seen is not None:
                    steps_seen.add(action, obs, reward, terminated, truncated)
                total += float(reward)
                steps += 1
                ended = bool(terminated or truncated)
            truncated_by_cap += not ended
            returns.append(total)
            lengths.append(steps)
            if writer is not None and steps_seen is not None and steps:
                writer.add(steps_seen.episode(policy, cut=not ended))
    finally:
        env.close()
        if writer is not None:
            writer.close()
    written = None
    if video is not None:
        written = str(write_video(frames, video, fps=_env_fps(env)))
    return EvalResult(returns, lengths, written, policy.greedy, truncated_by_cap)


class _Steps:
    """One episode's steps as evaluate plays them, for a dataset (Minari's layout)."""

    def __init__(self, obs: Any) -> None:
        self.observations = [obs]
        self.actions: list[Any] = []
        self.rewards: list[float] = []
        self.terminations: list[bool] = []
        self.truncations: list[bool] = []

    def add(self, action: Any, obs: Any, reward: Any, terminated: Any, truncated: Any) -> None:
        self.actions.append(action)
        self.observations.append(obs)
        self.rewards.append(float(reward))
        self.terminations.append(bool(terminated))
        self.truncations.append(bool(truncated))

    def episode(self, policy: Policy, cut: bool) -> dataset.Episode:
        """The steps stacked leaf by leaf; ``cut``: stopped at ``--max-steps``, stored as
        truncated there (the env did not end it, so nothing bootstraps as if it had)."""
        truncations = np.array(self.truncations)
        truncations[-1] |= cut
        return dataset.Episode(
            observations=_stacked(policy.env_spec.observation_space, self.observations),
            actions=_stacked(policy.env_spec.action_space, self.actions),
            rewards=np.array(self.rewards),
            terminations=np.array(self.terminations),
            truncations=truncations,
        )


def _stacked(spec: pb.SpaceSpec, values: list[Any]) -> Any:
    """Values of one space stacked along a new first axis, leaf by leaf for a dict/tuple."""
    if not codec.is_structured(spec):
        return np.stack([np.asarray(v) for v in values])
    leaves = [codec.flatten_values(spec, v) for v in values]
    columns = [np.stack([np.asarray(x[i]) for x in leaves]) for i in range(len(leaves[0]))]
    return codec.unflatten_values(spec, columns)


def evaluate_shared(
    policy: Policy,
    env: AgentsEnv,
    episodes: int,
    seed: int = 0,
    max_steps: int = 100_000,
    video: str | Path | None = None,
) -> EvalResult:
    """A multi-agent env with ``policy`` in every agent's seat (each agent its own copy,
    for its own recurrent state): per-agent and team returns of ``episodes`` episodes."""
    frames: list[np.ndarray] = []
    players = [copy.copy(policy) for _ in env.agent_ids]
    rows = AgentEnvs(policy.env_id, [lambda: env.env])
    agent_means: list[float] = []
    teams: list[float] = []
    lengths: list[int] = []
    cut = 0
    try:
        for episode in range(episodes):
            for player in players:
                player.reset()
            record = video is not None and episode == 0
            on_step = (lambda: frames.append(np.asarray(env.env.render()))) if record else None
            played = play_episode(
                rows, lambda row, obs: players[row].act(obs), seed + episode, max_steps, on_step
            )
            agent_means.append(played.agent_mean)
            teams.append(played.team)
            lengths.append(played.steps)
            cut += not played.ended
    finally:
        rows.close()
    written = None if video is None else str(write_video(frames, video, fps=_env_fps(env)))
    return EvalResult(agent_means, lengths, written, policy.greedy, cut, len(players), teams)


def _env_fps(env: Any) -> int:
    fps = getattr(env, "metadata", {}).get("render_fps")
    return int(fps) if fps else 30


MIN_VIDEO_SIDE = 160
"""Smaller renders (MinAtar's 10x10) are upscaled by whole pixels to at least this."""


def video_frame(frame: Any) -> np.ndarray:
    """An rgb_array render as ``uint8 [H, W, 3]``: floats in [0, 1] scaled, tiny ones upscaled."""
    array = np.asarray(frame)
    if array.dtype.kind == "f":
        array = np.clip(array * 255.0, 0, 255)
    array = array.astype(np.uint8)
    factor = math.ceil(MIN_VIDEO_SIDE / max(1, min(array.shape[:2])))
    if factor > 1:
        array = np.repeat(np.repeat(array, factor, axis=0), factor, axis=1)
    return array


def write_video(frames: list[np.ndarray], path: str | Path, fps: int = 30) -> Path:
    """GIF with Pillow (always there with matplotlib); MP4 needs imageio + imageio-ffmpeg."""
    path = Path(path)
    if not frames or frames[0] is None or np.asarray(frames[0]).ndim != 3:
        raise ValueError("the env rendered no rgb_array frames; cannot write a video")
    path.parent.mkdir(parents=True, exist_ok=True)
    frames = [video_frame(f) for f in frames]
    if path.suffix.lower() == ".gif":
        from PIL import Image

        images = [Image.fromarray(f) for f in frames]
        duration_ms = max(20, round(1000 / fps))
        images[0].save(path, save_all=True, append_images=images[1:], duration=duration_ms, loop=0)
        return path
    try:
        import imageio.v2 as imageio
    except ImportError as exc:
        raise ValueError(f"{path}: MP4 needs imageio and imageio-ffmpeg; use .gif") from exc
    imageio.mimwrite(path, list[Any](frames), fps=fps)
    return path


def use_env(policy: Policy, env_id: str, env_kwargs: dict[str, Any]) -> None:
    """Evaluate ``policy`` on ``env_id`` (the user's own choice, so built without asking)
    instead of the checkpoint's env; its spaces must be the checkpoint's."""
    spec = envs.describe_env(env_id, env_kwargs)
    if (mismatch := codec.space_mismatch(policy.env_spec, spec)) is not None:
        name, theirs, ours = mismatch
        raise ValueError(f"--env {env_id}: {name} {ours}, the checkpoint was trained with {theirs}")
    policy.env_spec = spec


def _json_object(text: str) -> dict[str, Any]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def loaded_line(info: checkpoint.CheckpointInfo) -> str:
    """Which checkpoint ``evaluate`` runs, and whether the run kept a better one beside it."""
    text = info.describe()
    best_path = info.path.with_name(checkpoint.BEST_FILE)
    if info.best_return is None and best_path.is_file():
        with contextlib.suppress(checkpoint.CheckpointError):
            best = checkpoint.CheckpointInfo.of(best_path, checkpoint.load(best_path))
            level, measure = info.return_mean, best.best_measure
            if best.best_return is None:
                return text
            if measure != checkpoint.BY_RETURN:  # another measure: not comparable, said as is
                value = checkpoint.best_text(best.best_return, measure)
                text += f" (the run's best by its {measure}, {value}, is in {best_path}: --best)"
            elif level is None or best.best_return > level:
                text += f" (the run's best, {best.best_return:.1f}, is in {best_path}: --best)"
    return text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m learner evaluate", description=__doc__)
    parser.add_argument(
        "--checkpoint", required=True,
        help="a checkpoint file, or a logdir: its checkpoint.pt (the latest), or with --best "
        "its checkpoint-best.pt (the best mean-100 return of the run; in self-play with "
        "fixed opponents, the best score against them)",
    )  # fmt: skip
    parser.add_argument(
        "--best", action="store_true", help="with a logdir: load its checkpoint-best.pt"
    )
    parser.add_argument("--episodes", type=int, default=10, help="full episodes to run")
    add_member_argument(parser)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--greedy", dest="greedy", action="store_true", default=True,
                      help="most likely action / Gaussian mean (default)")  # fmt: skip
    mode.add_argument("--sample", dest="greedy", action="store_false",
                      help="sample actions from the policy")  # fmt: skip
    parser.add_argument("--video", help="write the first episode to this .gif (or .mp4)")
    parser.add_argument("--seed", type=int, default=0, help="env seed of the first episode")
    parser.add_argument("--max-steps", type=int, default=100_000, help="cap per episode")
    parser.add_argument(
        "--env",
        help="run this env instead of the checkpoint's (same spaces); with the checkpoint's own "
        "id it confirms a module:callable env named there",
    )
    parser.add_argument(
        "--env-kwargs", type=_json_object, default=None,
        help="JSON kwargs for --env (default: the checkpoint's when --env is its env, else {})",
    )  # fmt: skip
    envs.add_allow_env_module_argument(parser)
    parser.add_argument(
        "--opponent",
        help="two-player games: play against random, heuristic (Connect Four's one-step "
        "lookahead), a CHECKPOINT (file or logdir) or a module:callable (observation dict, "
        "action_mask included -> action); prints win/draw/loss per seat",
    )
    parser.add_argument(
        "--games", type=int, default=100,
        help="with --opponent: games per seat (as many as the first player as the second)",
    )  # fmt: skip
    parser.add_argument("--json", help="with --opponent: also write the results to this file")
    parser.add_argument(
        "--record-dataset", metavar="DIR",
        help="also write every episode to a Minari dataset in DIR, whose last part (NAME-vN) "
        "is its id: MINARI_DATASETS_PATH=$(dirname DIR) minari.load_dataset(NAME-vN)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    path = Path(args.checkpoint)
    if path.is_dir():
        path = path / (checkpoint.BEST_FILE if args.best else "checkpoint.pt")
    elif args.best:
        parser.exit(2, f"error: --best picks checkpoint-best.pt in a logdir; {path} is not one\n")
    if args.opponent is not None:
        if args.video:
            parser.exit(2, "error: --video records single-agent episodes, not --opponent games\n")
        return _match_main(parser, args, path)
    try:
        policy = Policy.load(path, greedy=args.greedy, member=args.member)
        if args.env is not None:
            same = args.env == policy.env_id
            kwargs = args.env_kwargs
            if kwargs is None:
                kwargs = policy.env_kwargs if same else {}
            use_env(policy, args.env, kwargs)
        else:
            envs.check_env_allowed(policy.env_id, args.allow_env_module, f"checkpoint {path}")
        assert policy.checkpoint_info is not None  # Policy.load always says where from
        member = "" if policy.member is None else f" ({policy.member} of the population)"
        print(f"seedrl evaluate: loaded {loaded_line(policy.checkpoint_info)}{member}", flush=True)
        torch.manual_seed(args.seed)
        result = evaluate(
            policy, args.episodes, args.seed, args.max_steps, args.video, args.record_dataset
        )
    except (checkpoint.CheckpointError, ValueError) as exc:
        parser.exit(2, f"error: {exc}\n")
    print(f"seedrl evaluate: {policy.env_id}: {result.summary()}")
    if args.record_dataset:
        print(f"dataset: {args.record_dataset} ({len(result.returns)} episodes)")
    if result.video:
        print(f"video: {result.video}")
    return 0 if math.isfinite(result.mean) else 1


def _checkpoint_file(text: str) -> Path:
    path = Path(text)
    return path / "checkpoint.pt" if path.is_dir() else path


def _match_main(parser: argparse.ArgumentParser, args: argparse.Namespace, path: Path) -> int:
    """``evaluate --opponent``: the policy against an opponent in both seats of a
    two-player game, rates printed per seat."""
    from learner.league import arena

    try:
        if args.games < 1:
            raise ValueError(f"--games must be >= 1, got {args.games}")
        policy = Policy.load(path, greedy=args.greedy, member=args.member)
        env_id = args.env if args.env is not None else policy.env_id
        if args.env is None:
            arena.check_aec_env_allowed(env_id, args.allow_env_module, f"checkpoint {path}")
        kwargs = args.env_kwargs
        if kwargs is None:
            kwargs = policy.env_kwargs if env_id == policy.env_id else {}
        env = arena.make_aec_env(env_id, kwargs)
        _check_spaces(policy, env, env_id)
        opponent = _opponent(args.opponent, env_id, args.seed, args.greedy)
        if isinstance(opponent, Policy):
            _check_spaces(opponent, env, env_id)
        assert policy.checkpoint_info is not None  # Policy.load always says where from
        print(f"seedrl evaluate: loaded {loaded_line(policy.checkpoint_info)}", flush=True)
        torch.manual_seed(args.seed)
        player = opponent if isinstance(opponent, Policy) else arena.ScriptedPlayer(opponent)
        result = arena.play_match(
            env, policy, player, args.games, args.opponent, args.seed, args.max_steps
        )
    except (checkpoint.CheckpointError, envs.EnvError, ValueError) as exc:
        parser.exit(2, f"error: {exc}\n")
    mode = "greedy" if policy.greedy else "sampled"
    games = f"{args.games} games per seat ({mode})"
    print(f"seedrl evaluate: {env_id} against {args.opponent}, {games}")
    print(result.summary())
    if args.json:
        Path(args.json).write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    return 0


def _opponent(spec: str, env_id: str, seed: int, greedy: bool) -> Any:
    """``--opponent``: a built-in name, a checkpoint (a Policy) or a module:callable."""
    from learner.league import opponents

    if spec not in opponents.SCRIPTED and Path(spec).exists():
        return Policy.load(_checkpoint_file(spec), greedy=greedy)
    if spec not in opponents.SCRIPTED and ":" not in spec:
        raise ValueError(
            f"--opponent {spec!r}: not random, heuristic, an existing checkpoint or module:callable"
        )
    return opponents.build(spec, env_id, seed + 1)  # its own stream, apart from the env's


def _check_spaces(policy: Policy, env: Any, env_id: str) -> None:
    """The game's per-agent spaces must be the ones the policy was trained on."""
    agent = env.possible_agents[0]
    for name, space in (
        ("observation_space", env.observation_space(agent)),
        ("action_space", env.action_space(agent)),
    ):
        ours, theirs = getattr(policy.env_spec, name), codec.space_to_spec(space)
        if not codec.specs_match(ours, theirs):
            raise ValueError(
                f"{env_id}: {name} {codec.spec_summary(theirs)}, the checkpoint "
                f"{policy.checkpoint_info.path if policy.checkpoint_info else ''} was trained "
                f"with {codec.spec_summary(ours)}"
            )
