"""``python -m learner [SUBCOMMAND] [flags]``: the learner's one command line.

Subcommands (a dispatch table; none given means ``train``):
  train        serve actors and learn (flags: ``python -m learner --help``); under
               ``torchrun --nproc-per-node=G`` each process is one data-parallel rank
  demo         a learner plus local actors on CartPole-v1 until solved, then a plot
  evaluate     run a checkpoint's policy for N episodes (mean/std return, optional video),
               or two-player games against an --opponent (win/draw/loss per seat)
  serve        serve a checkpoint's policy to actors without training it (--greedy or sampled)
  export       a checkpoint's policy as one ONNX or TorchScript file (+ FILE.json)
  tournament   a self-play checkpoint's pool, every snapshot against every other: Elo
  plot         render the learning curve of a log directory to a PNG
  healthcheck  exit 0 when the learner at --address reports SERVING (container probes)
  bench        ``make bench``: runs ``benchmarks/`` from a source checkout (not installed)
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from importlib.util import find_spec
from pathlib import Path
from typing import Any

TRAIN_DESCRIPTION = (
    "Run a seedrl learner: batched inference + V-trace. Other subcommands: "
    "demo, evaluate, serve, export, plot, tournament, healthcheck, bench (python -m learner "
    "SUBCOMMAND --help)."
)


def train_main(argv: Sequence[str]) -> int:
    from seedrl.cli import parse_config
    from seedrl.config import LearnerConfig

    config = parse_config(LearnerConfig, argv, "python -m learner", TRAIN_DESCRIPTION, True)
    ranked = os.environ.get("WORLD_SIZE", "1") not in ("", "1")  # started by torchrun
    if ranked and config.trainer not in ("auto", "thread"):
        # Ranks step in lockstep inside the learner process, so only the thread trainer fits.
        print(
            f"python -m learner: error: --trainer {config.trainer} cannot run under torchrun: "
            "ranks train in a thread (use --trainer auto or thread)",
            file=sys.stderr,
        )
        return 2
    if ranked and config.policy_mapping:
        print(
            "python -m learner: error: --policy-mapping cannot run under torchrun: ranks "
            "train one policy in lockstep (run one learner process)",
            file=sys.stderr,
        )
        return 2
    if ranked and config.population > 1:
        print(
            "python -m learner: error: --population cannot run under torchrun: ranks "
            "train one policy in lockstep (run one learner process)",
            file=sys.stderr,
        )
        return 2
    if ranked and config.standby:
        print(
            "python -m learner: error: --standby cannot run under torchrun: a standby is one "
            "learner process (run it beside rank 0's host, without torchrun)",
            file=sys.stderr,
        )
        return 2
    if config.wandb and find_spec("wandb") is None:
        from learner.metrics import WANDB_MISSING

        print(f"python -m learner: error: {WANDB_MISSING}", file=sys.stderr)
        return 2
    from learner.run import run_rank, serve

    if ranked:
        return run_learner("python -m learner", lambda: run_rank(config), config.uvloop)
    return run_learner("python -m learner", lambda: serve(config), config.uvloop)


def run_learner(prog: str, run: Callable[[], Coroutine[Any, Any, Any]], uvloop: bool) -> int:
    """Run a learner's coroutine to its end; what refuses to start is one line, exit 2."""
    from learner.agents.models import UnsupportedSetup
    from learner.metrics import SinkError
    from learner.serving.tier import ServingFailed
    from learner.state.checkpoint import CheckpointError
    from seedrl.envs import EnvError
    from seedrl.security import UnprotectedBindError
    from seedrl.transport import run_event_loop

    try:
        run_event_loop(run(), uvloop)
    except UnprotectedBindError as exc:  # refused before anything is built or bound
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except EnvError as exc:
        print(f"{prog}: error: --env {exc}", file=sys.stderr)
        return 2
    except SinkError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except UnsupportedSetup as exc:  # spaces no model or head here fits, refused at start
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ServingFailed as exc:  # the serving tier's frontend kept dying
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    return 0


BENCH_MODULE = "benchmarks.bench"


def bench_main(argv: Sequence[str]) -> int:
    """Run ``python -m benchmarks.bench`` in place of this process, from the checkout.

    The benchmark is not part of the installed package: it is found on ``sys.path`` (the
    repository root as the working directory) or beside this package in a checkout
    (an editable install).
    """
    checkout = Path(__file__).resolve().parents[1]
    if find_spec("benchmarks") is not None:
        root = None
    elif (checkout / "benchmarks" / "bench" / "__main__.py").is_file():
        root = str(checkout)
    else:
        print(
            "error: bench needs the seedrl source checkout: benchmarks/ is not installed "
            "with the package (git clone the repository and run `make bench` there)",
            file=sys.stderr,
        )
        return 2
    if root is not None:
        path = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, path) if p)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", BENCH_MODULE, *argv])


def _module_main(module: str) -> Callable[[Sequence[str]], int]:
    """A subcommand run by ``module.main(argv)``, imported only when chosen."""

    def run(argv: Sequence[str]) -> int:
        return int(importlib.import_module(module).main(list(argv)))

    return run


SUBCOMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "train": train_main,
    "demo": _module_main("learner.tools.demo"),
    "evaluate": _module_main("learner.tools.evaluate"),
    "serve": _module_main("learner.tools.serve"),
    "export": _module_main("learner.tools.export"),
    "plot": _module_main("learner.tools.plot"),
    "tournament": _module_main("learner.league.tournament"),
    "healthcheck": _module_main("learner.serving.healthcheck"),
    "bench": bench_main,
}
"""Subcommand -> what runs it with the remaining arguments."""
DEFAULT = "train"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=os.environ.get("SEEDRL_LOG_LEVEL", "WARNING"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    name = args.pop(0) if args and args[0] in SUBCOMMANDS else DEFAULT
    return SUBCOMMANDS[name](args)


if __name__ == "__main__":
    sys.exit(main())
