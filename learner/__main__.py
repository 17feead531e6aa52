"""``python -m learner [flags]`` trains; ``python -m learner plot|demo ...`` are helpers.

Subcommands:
  (none)    train: serve actors and learn (flags: ``python -m learner --help``);
            under ``torchrun --nproc-per-node=G`` each process is one data-parallel rank
  demo      a learner plus local actors on CartPole-v1 until solved, then a plot
  plot      render the learning curve of a log directory to a PNG
  healthcheck  exit 0 when the learner at --address reports SERVING (container probes)
  evaluate  run a checkpoint's policy for N episodes (mean/std return, optional video)
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence


def train_main(argv: Sequence[str]) -> int:
    from learner.checkpoint import CheckpointError
    from learner.run import serve
    from seedrl.config import LearnerConfig, parse_config
    from seedrl.transport import run_event_loop

    config = parse_config(
        LearnerConfig,
        argv,
        "python -m learner",
        "Run a seedrl learner: batched inference + V-trace.",
        presets=True,
    )
    try:
        if os.environ.get("WORLD_SIZE", "1") not in ("", "1"):  # started by torchrun
            from learner.distributed import run_rank

            run_event_loop(run_rank(config), config.uvloop)
        else:
            run_event_loop(serve(config), config.uvloop)
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=os.environ.get("SEEDRL_LOG_LEVEL", "WARNING"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args and args[0] == "plot":
        from learner.plot import main as plot_main

        return plot_main(args[1:])
    if args and args[0] == "healthcheck":
        from learner.healthcheck import main as healthcheck_main

        return healthcheck_main(args[1:])
    if args and args[0] == "evaluate":
        from learner.evaluate import main as evaluate_main

        return evaluate_main(args[1:])
    if args and args[0] == "demo":
        from learner.demo import main as demo_main

        return demo_main(args[1:])
    return train_main(args)


if __name__ == "__main__":
    sys.exit(main())
