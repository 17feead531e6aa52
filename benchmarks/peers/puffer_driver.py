"""PufferLib 3 PPO, its own example configs: CartPole-v1 until the mean of the last 100
training episodes reaches the target (or a cap), and Atari Pong for a fixed wall time.

Runs inside the PufferLib virtual environment that ``benchmarks.peers.venvs`` builds
(it imports nothing of seedrl), as ``python -m benchmarks.peers.puffer_driver
cartpole|atari``; its last stdout line is the result (``benchmarks.peers.measure``).

The settings are PufferLib's config files, read by its own ``pufferl.load_config``
(``config/default.ini`` under ``classic_control.ini`` for ``cartpole``, ``atari.ini``
for ``pong``), with ``device = cpu``. Training is PufferLib's ``PuffeRL`` loop
(``evaluate`` then ``train``, as ``pufferl.train`` runs it), driven here so that every
finished episode's return (its ``EpisodeStats`` wrapper's ``episode_return``) goes to
the same 100-episode window seedrl uses and the agent-step count is sampled after each
update. Two departures, each forced by the 3.0.0 release and recorded in the result:
its classic_control env module imports ``pufferlib.postprocess``, which 3.0.0 no longer
ships, so the driver builds the same env stack (gymnasium env, observations clipped to
[-1, 1], ``EpisodeStats``, ``GymnasiumPufferEnv``) itself on CartPole-v1 (its alias
``cartpole`` is v0, capped at 200); and that config's ``[train] num_envs = 64`` is read
as the vector's env count, with the minibatch cut to the batch it then collects (the
default 8192 exceeds it, which PuffeRL refuses).
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Sequence
from typing import Any

from benchmarks.peers.measure import (
    ReturnWindow,
    emit_result,
    say,
    task_driver_parser,
    task_outcome,
)

REPORT_EVERY_S = 5.0
CONFIG_NAMES = {"cartpole": "cartpole", "atari": "pong"}
"""The env names whose config files ``pufferl.load_config`` picks."""


def make_cartpole(buf: Any = None, seed: int = 0) -> Any:
    """PufferLib's classic_control env stack (``environments/classic_control``) on
    CartPole-v1."""
    import gymnasium
    import numpy as np
    import pufferlib
    import pufferlib.emulation

    env = gymnasium.make("CartPole-v1")
    # gymnasium 0.29's signature (PufferLib's pin); 1.x, which mypy sees, adds the space.
    clip = gymnasium.wrappers.TransformObservation
    env = clip(env, lambda obs: np.clip(obs, -1, 1))  # type: ignore[call-arg]
    env = pufferlib.EpisodeStats(env)
    return pufferlib.emulation.GymnasiumPufferEnv(env=env, buf=buf)


def load(task: str, seed: int, data_dir: str) -> tuple[dict[str, Any], Any, Any, list[str], int]:
    """(PuffeRL's train config, vector env, policy, departures from the example, the
    emulator frames per agent step)."""
    import psutil
    import pufferlib.vector
    from pufferlib import pufferl

    sys.argv = sys.argv[:1]  # load_config parses the command line for its own flags
    args = pufferl.load_config(CONFIG_NAMES[task])
    departures = []
    train = dict(args["train"])
    vec = dict(args["vec"])
    vec["seed"] = seed
    train.update(device="cpu", seed=seed, data_dir=data_dir, env=CONFIG_NAMES[task])
    if task == "cartpole" and "num_envs" in train:
        vec["num_envs"] = int(train.pop("num_envs"))
        departures.append(f"[train] num_envs = {vec['num_envs']} as the vector's envs")
    workers, envs = vec.get("num_workers", "auto"), int(vec["num_envs"])
    cores = psutil.cpu_count(logical=False) or 1
    if workers == "auto" or int(workers) > cores:
        # PufferLib refuses more worker processes than cores unless told to overwork.
        vec["num_workers"] = max(d for d in range(1, cores + 1) if envs % d == 0)
        departures.append(f"{vec['num_workers']} workers for {envs} envs (config: "
                          f"{workers}; one per core, {cores} here)")  # fmt: skip
    args["vec"] = vec
    if task == "cartpole":
        vecenv = pufferlib.vector.make(functools.partial(make_cartpole), **vec)
        from pufferlib.models import Default

        policy = Default(vecenv.driver_env, **args["policy"])
        departures.append("CartPole-v1 on the example's env stack (pufferlib.postprocess gone)")
    else:
        vecenv = pufferl.load_env(CONFIG_NAMES[task], args)
        args["train"] = train  # args stays PufferLib's defaultdict: load_policy reads its gaps
        policy = pufferl.load_policy(args, vecenv)
    batch = vecenv.num_agents * int(train["bptt_horizon"])
    if train.get("batch_size") == "auto":
        train["batch_size"] = batch
    if int(train["minibatch_size"]) > int(train["batch_size"]):
        departures.append(f"minibatch {train['minibatch_size']} cut to the batch "
                          f"{train['batch_size']}")  # fmt: skip
        train["minibatch_size"] = int(train["batch_size"])
    train.setdefault("use_rnn", args["rnn_name"] is not None)
    frame_skip = int(args["env"].get("frameskip", 1)) if task == "atari" else 1
    return train, vecenv, policy, departures, frame_skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = task_driver_parser(
        "python -m benchmarks.peers.puffer_driver", "--data-dir", frame_cap=2_000_000
    )
    args = parser.parse_args(argv)

    from pufferlib import pufferl

    train, vecenv, policy, departures, frame_skip = load(args.task, args.seed, args.data_dir)
    train["total_timesteps"] = max(int(train["total_timesteps"]), args.frame_cap)
    trainer = pufferl.PuffeRL(train, vecenv, policy)
    window = ReturnWindow(args.target)
    samples: list[tuple[float, float]] = []  # (monotonic s, agent steps)
    found: dict[str, Any] = {}
    seen, stats = 0, None
    next_report = 0.0
    while "stopped_by" not in found:
        trainer.evaluate()
        if trainer.stats is not stats:  # PuffeRL starts a new dict after each log
            stats, seen = trainer.stats, 0
        returns = stats.get("episode_return", [])
        if "reached_at" not in found and window.add(returns[seen:]):
            found["reached_at"], found["frames"] = time.monotonic(), trainer.global_step
        seen = len(returns)
        trainer.train()
        now = time.monotonic()
        samples.append((now, trainer.global_step))
        started = samples[0][0]
        if "reached_at" in found:
            found["stopped_by"] = "target"
        elif args.task == "atari" and now - started >= args.warmup_s + args.measure_s:
            found["stopped_by"] = "measured"
        elif now - args.launched_at >= args.wall_cap_s:
            found["stopped_by"] = "wall cap"
        elif trainer.global_step >= args.frame_cap:
            found["stopped_by"] = "frame cap"
        if now >= next_report:
            mean = "-" if window.mean is None else f"{window.mean:.1f}"
            say(f"pufferlib {args.task}: {trainer.global_step:,} agent steps, "
                f"mean return {mean}, {now - started:.0f} s")  # fmt: skip
            next_report = now + REPORT_EVERY_S
    end = time.monotonic()
    vecenv.close()
    trainer.utilization.stop()
    started = samples[0][0] if samples else end
    result: dict[str, Any] = {
        "startup_s": started - args.launched_at,
        "frames": samples[-1][1] if samples else 0,
        "wall_s": end - args.launched_at,
        "episodes": window.episodes,
        "return_mean100": window.mean,
        "frame_skip": frame_skip,
        "stopped_by": found["stopped_by"],
        "summary": f"{vecenv.num_agents} envs, batch {train['batch_size']}, minibatch "
        f"{train['minibatch_size']}, {train['optimizer']}, pufferl.load_config"
        f"({CONFIG_NAMES[args.task]!r})",
        "settings": {"train": {k: v for k, v in train.items() if isinstance(v, (int, float, str))},
                     "departures": departures},
    }  # fmt: skip
    result.update(task_outcome(args.task, found, args.launched_at, started, samples, args.warmup_s))
    emit_result(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
