"""Stable-Baselines3 PPO on CartPole-v1 with the rl-baselines3-zoo hyperparameters, until
the mean of the last 100 training episodes reaches the target, a frame cap or a wall cap.

Runs inside the SB3 virtual environment that ``benchmarks.peers.venvs`` builds (it
imports nothing of seedrl), as ``python -m benchmarks.peers.sb3_driver``; its last
stdout line is the result (``benchmarks.peers.measure``).

The settings are the zoo's tuned ``CartPole-v1`` entry of ``hyperparams/ppo.yml``:
8 envs in a ``DummyVecEnv`` (the zoo's default), ``lin_`` schedules decaying to zero
over the zoo's 1e5 timesteps (so the frame cap is also the schedule's horizon).

With ``--env`` (a structured-suite env, ``module:callable``) it trains PPO with SB3's
defaults instead, for the wall cap: ``MultiInputPolicy`` for a dict observation,
``MlpPolicy`` for a flat one, and a tuple observation flattened first (gymnasium's
``FlattenObservation``: SB3 has no tuple observations). The rollout: 64
steps of each of the envs (2048 at 32 envs, the size of SB3's default one-env rollout)
in minibatches of 512; everything else is SB3's default. SB3's PPO reads no action mask:
a masked env's mask is one more input, and a masked choice earns nothing.
"""

from __future__ import annotations

import argparse
import importlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.peers.measure import ReturnWindow, curve_point, driver_parser, emit_result, say

ZOO_CARTPOLE: dict[str, Any] = {
    "n_envs": 8,
    "n_timesteps": 100_000,
    "n_steps": 32,
    "batch_size": 256,
    "gae_lambda": 0.8,
    "gamma": 0.98,
    "n_epochs": 20,
    "ent_coef": 0.0,
    "learning_rate": "lin_0.001",
    "clip_range": "lin_0.2",
}
"""rl-baselines3-zoo ``hyperparams/ppo.yml``, ``CartPole-v1`` (policy ``MlpPolicy``)."""
STRUCTURED: dict[str, Any] = {"n_steps": 64, "batch_size": 512}
"""What the structured runs set beside SB3's PPO defaults (the module docstring says why)."""
REPORT_EVERY_S = 5.0


def linear(initial: float) -> Callable[[float], float]:
    """The zoo's ``lin_<x>``: ``x`` scaled by the share of training still to run."""

    def schedule(progress_remaining: float) -> float:
        return progress_remaining * initial

    return schedule


def zoo_value(value: Any) -> Any:
    if isinstance(value, str) and value.startswith("lin_"):
        return linear(float(value[len("lin_") :]))
    return value


def env_factory(env_id: str) -> Callable[[], Any]:
    """The ``module:callable`` factory of a structured env (imported here: this venv has
    no seedrl to resolve ids)."""
    module, sep, attr = env_id.partition(":")
    factory = getattr(importlib.import_module(module), attr, None) if sep else None
    if not callable(factory):
        raise SystemExit(f"--env {env_id!r} is not a module:callable env factory")
    return factory


def policy_for(space: Any) -> str:
    """SB3's policy for an observation space (after flattening a tuple one)."""
    from gymnasium import spaces

    return "MultiInputPolicy" if isinstance(space, spaces.Dict) else "MlpPolicy"


def sb3_wrapper(space: Any) -> Any:
    """The wrapper SB3 needs around an env with this observation space (None: none)."""
    from gymnasium import spaces
    from gymnasium.wrappers import FlattenObservation

    return FlattenObservation if isinstance(space, spaces.Tuple) else None


def structured(args: argparse.Namespace) -> int:
    """PPO with SB3's defaults on a structured env for the wall cap, curve and all."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    factory = env_factory(args.env)
    probe = factory()
    wrapper = sb3_wrapper(probe.observation_space)
    probe.close()
    window = ReturnWindow(float("inf"))
    curve: list[list[float | None]] = []
    found: dict[str, Any] = {}

    class UntilWallCap(BaseCallback):
        """Feeds finished episodes to the window, samples the curve, stops at the cap."""

        def _on_training_start(self) -> None:
            found["train_started"] = time.monotonic()
            self.next_sample = found["train_started"]

        def _on_step(self) -> bool:
            now = time.monotonic()
            window.add(i["episode"]["r"] for i in self.locals["infos"] if "episode" in i)
            if now >= self.next_sample:
                curve.append(curve_point(now - args.launched_at, self.num_timesteps, window.mean))
                mean = "-" if window.mean is None else f"{window.mean:.2f}"
                say(f"sb3 ppo: {self.num_timesteps:,} frames, mean return {mean}")
                self.next_sample = now + REPORT_EVERY_S
            return now - args.launched_at < args.wall_cap_s

    env = make_vec_env(factory, n_envs=args.num_envs, seed=args.seed, wrapper_class=wrapper)
    policy = policy_for(env.observation_space)
    model = PPO(policy, env, **STRUCTURED, seed=args.seed, device="cpu", verbose=0)
    model.learn(total_timesteps=10**12, callback=UntilWallCap())
    end = time.monotonic()
    env.close()
    curve.append(curve_point(end - args.launched_at, int(model.num_timesteps), window.mean))
    started = found.get("train_started", end)
    capped = end - args.launched_at >= args.wall_cap_s
    flattened = ", tuple observation flattened" if wrapper is not None else ""
    emit_result(
        {
            "startup_s": started - args.launched_at,
            "frames": int(model.num_timesteps),
            "wall_s": end - args.launched_at,
            "episodes": window.episodes,
            "return_mean100": window.mean,
            "curve": curve,
            "stopped_by": "wall cap" if capped else "ended early",
            "summary": f"{args.num_envs} envs, {policy}, SB3 defaults{flattened}",
            "settings": {"algo": "PPO", "policy": policy, "env": args.env, "seed": args.seed,
                         "n_envs": args.num_envs, "flattened": wrapper is not None,
                         **STRUCTURED},
        }
    )  # fmt: skip
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = driver_parser("python -m benchmarks.peers.sb3_driver")
    parser.add_argument("--env", default="", help="a structured env (module:callable)")
    parser.add_argument("--num-envs", type=int, default=32, help="with --env: envs stepped")
    args = parser.parse_args(argv)
    if args.env:
        return structured(args)

    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    hp = ZOO_CARTPOLE
    window = ReturnWindow(args.target)
    found: dict[str, Any] = {}

    class UntilSolved(BaseCallback):
        """Feeds finished episodes (the Monitor wrapper's ``episode`` info) to the window
        and stops training once it holds or the wall cap passes."""

        def _on_training_start(self) -> None:
            found["train_started"] = time.monotonic()
            self.next_report = found["train_started"] + 5.0

        def _on_step(self) -> bool:
            now = time.monotonic()
            returns = [i["episode"]["r"] for i in self.locals["infos"] if "episode" in i]
            if returns and window.add(returns):
                found["reached_at"] = now
                found["frames"] = self.num_timesteps
                return False
            if now >= self.next_report:
                mean = "-" if window.mean is None else f"{window.mean:.1f}"
                say(f"sb3 ppo: {self.num_timesteps:,} frames, mean return {mean}")
                self.next_report = now + 5.0
            return now - args.launched_at < args.wall_cap_s

    env = make_vec_env("CartPole-v1", n_envs=hp["n_envs"], seed=args.seed)
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=hp["n_steps"],
        batch_size=hp["batch_size"],
        gae_lambda=hp["gae_lambda"],
        gamma=hp["gamma"],
        n_epochs=hp["n_epochs"],
        ent_coef=hp["ent_coef"],
        learning_rate=zoo_value(hp["learning_rate"]),
        clip_range=zoo_value(hp["clip_range"]),
        seed=args.seed,
        device="cpu",
        verbose=0,
    )
    model.learn(total_timesteps=hp["n_timesteps"], callback=UntilSolved())
    end = time.monotonic()
    env.close()
    started = found.get("train_started", end)
    reached = "reached_at" in found
    emit_result(
        {
            "reached": reached,
            "frames_to_target": found.get("frames"),
            "launch_to_target_s": found["reached_at"] - args.launched_at if reached else None,
            "train_to_target_s": found["reached_at"] - started if reached else None,
            "startup_s": started - args.launched_at,
            "frames": int(model.num_timesteps),
            "wall_s": end - args.launched_at,
            "episodes": window.episodes,
            "return_mean100": window.mean,
            "stopped_by": "target" if reached else _cap(model.num_timesteps, hp, end, args),
            "summary": f"{hp['n_envs']} envs, rl-zoo ppo.yml CartPole-v1",
            "settings": {"algo": "PPO", "policy": "MlpPolicy", "seed": args.seed, **hp},
        }
    )
    return 0


def _cap(frames: int, hp: dict[str, Any], end: float, args: argparse.Namespace) -> str:
    if frames >= hp["n_timesteps"]:
        return "frame cap"
    return "wall cap" if end - args.launched_at >= args.wall_cap_s else "ended early"


if __name__ == "__main__":
    raise SystemExit(main())
