"""Sample Factory APPO, its own examples: CartPole-v1 until the mean of the last 100
training episodes reaches the target (or a cap), and Atari Pong for a fixed wall time.

Runs inside the Sample Factory virtual environment that ``benchmarks.peers.venvs``
builds (it imports nothing of seedrl), as ``python -m benchmarks.peers.sf_driver
cartpole|atari``; its last stdout line is the result (``benchmarks.peers.measure``).

The experiments are the package's ``sf_examples``: ``train_gym_env`` with the flags its
docstring gives for CartPole-v1, and ``atari.train_atari`` (``atari_pong``, the
example's defaults), each with ``--device=cpu`` and a fresh experiment directory. The
runner is driven through Sample Factory's public hooks (an ``AlgoObserver`` and an
episodic-stats handler): the handler feeds episode returns to the same 100-episode
window seedrl uses, and the observer samples the learner's env-step count after each
training iteration and ends training by lowering ``train_for_env_steps``.
"""

from __future__ import annotations

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

CARTPOLE_ARGS = [
    "--algo=APPO", "--use_rnn=False", "--num_envs_per_worker=20",
    "--policy_workers_per_policy=2", "--recurrence=1", "--with_vtrace=False",
    "--batch_size=512", "--reward_scale=0.1", "--save_every_sec=10",
    "--experiment_summaries_interval=10", "--env=CartPole-v1",
]  # fmt: skip
"""``sf_examples/train_gym_env.py``'s example command line for CartPole-v1."""
ATARI_ARGS = ["--algo=APPO", "--env=atari_pong"]
"""``sf_examples/atari/train_atari.py`` with its Atari defaults (``atari_params.py``)."""
EXAMPLES = {"cartpole": "sf_examples.train_gym_env", "atari": "sf_examples.atari atari_pong"}
REPORT_EVERY_S = 5.0


def make_pong(
    full_env_name: str, cfg: Any = None, env_config: Any = None, render_mode: Any = None
) -> Any:
    """The example's Atari env factory, after ale-py registered its gymnasium ids
    (ale-py 0.9 registers on import; the worker processes import this module)."""
    import ale_py  # noqa: F401
    from sf_examples.atari.atari_utils import make_atari_env

    return make_atari_env(full_env_name, cfg, env_config, render_mode=render_mode)


def main(argv: Sequence[str] | None = None) -> int:
    parser = task_driver_parser(
        "python -m benchmarks.peers.sf_driver", "--train-dir", frame_cap=2_000_000
    )
    args = parser.parse_args(argv)

    from sample_factory.algo.runners.runner import AlgoObserver, Runner
    from sample_factory.algo.utils.misc import EPISODIC
    from sample_factory.cfg.arguments import parse_full_cfg, parse_sf_args
    from sample_factory.envs.env_utils import register_env
    from sample_factory.train import make_runner

    common = [
        f"--train_dir={args.train_dir}", f"--experiment=sf-{args.task}", "--device=cpu",
        "--restart_behavior=overwrite", f"--seed={args.seed}",
        f"--train_for_env_steps={args.frame_cap}",
    ]  # fmt: skip
    if args.task == "cartpole":
        from sf_examples.train_gym_env import make_gym_env_func

        register_env("CartPole-v1", make_gym_env_func)
        sf_argv = CARTPOLE_ARGS + common
        parser_sf, _ = parse_sf_args(argv=sf_argv)
    else:
        from sf_examples.atari.atari_params import atari_override_defaults

        register_env("atari_pong", make_pong)
        sf_argv = ATARI_ARGS + common
        parser_sf, partial = parse_sf_args(argv=sf_argv)
        atari_override_defaults(partial.env, parser_sf)
    cfg = parse_full_cfg(parser_sf, sf_argv)
    # Sample Factory's env steps count emulator frames when it multiplies by frame skip.
    skip = int(cfg.env_frameskip) if cfg.summaries_use_frameskip else 1

    window = ReturnWindow(args.target)
    samples: list[tuple[float, float]] = []  # (monotonic s, agent steps)
    found: dict[str, Any] = {}

    def agent_steps(runner: Runner) -> int:
        return int(runner.env_steps.get(0, 0)) // skip

    def on_episodes(runner: Runner, msg: dict[str, Any], policy_id: int) -> None:
        reward = msg[EPISODIC].get("reward")
        if reward is None or "reached_at" in found:
            return
        values = reward.tolist() if hasattr(reward, "tolist") else reward
        if window.add(values if isinstance(values, list) else [values]):
            found["reached_at"] = time.monotonic()
            found["frames"] = agent_steps(runner)

    class Clock(AlgoObserver):
        def __init__(self) -> None:
            self.next_report = 0.0

        def on_training_step(self, runner: Runner, training_iteration_since_resume: int) -> None:
            now = time.monotonic()
            samples.append((now, agent_steps(runner)))
            started = samples[0][0]
            if "reached_at" in found:
                found.setdefault("stopped_by", "target")
            elif args.task == "atari" and now - started >= args.warmup_s + args.measure_s:
                found.setdefault("stopped_by", "measured")
            elif now - args.launched_at >= args.wall_cap_s:
                found.setdefault("stopped_by", "wall cap")
            if "stopped_by" in found:
                runner.cfg.train_for_env_steps = 0  # ends after this iteration
            if now >= self.next_report:
                mean = "-" if window.mean is None else f"{window.mean:.1f}"
                say(f"sample factory {args.task}: {samples[-1][1]:,} agent steps, "
                    f"mean return {mean}, {now - started:.0f} s")  # fmt: skip
                self.next_report = now + REPORT_EVERY_S

    cfg, runner = make_runner(cfg)
    runner.register_episodic_stats_handler(on_episodes)
    runner.register_observer(Clock())
    status = runner.init()
    if status == 0:
        status = runner.run()
    end = time.monotonic()
    started = samples[0][0] if samples else end
    result: dict[str, Any] = {
        "status_code": int(status),
        "startup_s": started - args.launched_at,
        "frames": samples[-1][1] if samples else 0,
        "wall_s": end - args.launched_at,
        "episodes": window.episodes,
        "return_mean100": window.mean,
        "frame_skip": int(cfg.env_frameskip),
        "summary": f"{cfg.num_workers} workers × {cfg.num_envs_per_worker} env(s), "
        f"batch {cfg.batch_size}, {EXAMPLES[args.task]}",
        "settings": {"argv": sf_argv, "num_workers": int(cfg.num_workers),
                     "num_envs_per_worker": int(cfg.num_envs_per_worker),
                     "batch_size": int(cfg.batch_size), "rollout": int(cfg.rollout)},
    }  # fmt: skip
    # Sample Factory ends by itself only at its frame cap (or on an error).
    result["stopped_by"] = found.get("stopped_by", "frame cap" if status == 0 else "error")
    result.update(task_outcome(args.task, found, args.launched_at, started, samples, args.warmup_s))
    emit_result(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
