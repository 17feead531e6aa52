"""Stable-Baselines3 PPO on CartPole-v1 with the rl-baselines3-zoo hyperparameters, until
the mean of the last 100 training episodes reaches the target, a frame cap or a wall cap.

Runs inside the SB3 virtual environment that ``benchmarks.peers.venvs`` builds (it
imports nothing of seedrl), as ``python -m benchmarks.peers.sb3_driver``; its last
stdout line is the result (``benchmarks.peers.measure``).

The settings are the zoo's tuned ``CartPole-v1`` entry of ``hyperparams/ppo.yml``:
8 envs in a ``DummyVecEnv`` (the zoo's default), ``lin_`` schedules decaying to zero
over the zoo's 1e5 timesteps (so the frame cap is also the schedule's horizon).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.peers.measure import ReturnWindow, driver_parser, emit_result, say

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


def linear(initial: float) -> Callable[[float], float]:
    """The zoo's ``lin_<x>``: ``x`` scaled by the share of training still to run."""

    def schedule(progress_remaining: float) -> float:
        return progress_remaining * initial

    return schedule


def zoo_value(value: Any) -> Any:
    if isinstance(value, str) and value.startswith("lin_"):
        return linear(float(value[len("lin_") :]))
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = driver_parser("python -m benchmarks.peers.sb3_driver")
    args = parser.parse_args(argv)

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
