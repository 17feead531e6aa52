"""``python -m benchmarks.learning.probe``: what moves in a long synchronous run, to find
why a solved policy collapses (docs/stability.md).

    python -m benchmarks.learning.probe run --env CartPole-v1 --seed 0 --frames 20000000 \\
        --out probe.jsonl [--set lr_schedule=constant] [--stop-below 250]
    python -m benchmarks.learning.probe plot probe.jsonl [other.jsonl ...] --png out.png \
        [--label "first run" --label "second run" ...]

``run`` trains in one process (``learner.tools.synchronous``, so a seed gives the same
run every time) and writes one JSON line per ``--every`` batches: the training scalars
(entropy, gradient norm, rho, value estimates and targets, the return scale, the learning
rate), the mean-100 return, and what Adam does with the gradient, for the policy's and
the value's parameters apart: the median of sqrt(v-hat) (the second-moment estimate each
step is divided by), the mean of |m-hat| / (sqrt(v-hat) + eps) (the step in units of the
learning rate), the RMS of the step itself and the RMS of the weights.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

POLICY, VALUE = "policy", "value"
PANELS = (
    ("ret100", "mean-100 return", False),
    ("entropy", "entropy", False),
    ("policy_update_rms", "policy step RMS", True),
    ("policy_sqrt_v_median", "policy Adam sqrt(v) median", True),
    ("policy_step_ratio", "policy |m|/(sqrt(v)+eps) mean", True),
    ("policy_weight_rms", "policy weight RMS", False),
    ("grad_norm", "gradient norm (before clip)", True),
    ("reward_norm_scale", "return scale (reward multiplier)", True),
    ("value_target_mean", "value target mean (training units)", False),
)
"""The plot's panels: metric key, title, log scale."""


def parameter_groups(model: torch.nn.Module) -> dict[str, list[torch.nn.Parameter]]:
    """The policy's parameters (torso and policy head) and the value's (value torso and
    baseline head), which Adam treats alike but whose gradients differ in scale."""
    groups: dict[str, list[torch.nn.Parameter]] = {POLICY: [], VALUE: []}
    for name, param in model.named_parameters():
        value = name.startswith(("value_torso", "baseline"))
        groups[VALUE if value else POLICY].append(param)
    return groups


def adam_diagnostics(
    optimizer: torch.optim.Optimizer, groups: dict[str, list[torch.nn.Parameter]]
) -> dict[str, float]:
    """Per group: sqrt(v-hat) median, mean |m-hat| / (sqrt(v-hat) + eps), RMS of the step
    Adam just took (lr x that ratio, no weight decay) and RMS of the weights."""
    settings = optimizer.param_groups[0]
    lr, eps, (beta1, beta2) = settings["lr"], settings["eps"], settings["betas"]
    out: dict[str, float] = {}
    for name, params in groups.items():
        states = [optimizer.state[p] for p in params if p in optimizer.state]
        if not states:
            continue
        step = float(states[0]["step"])
        m_hat = torch.cat([s["exp_avg"].flatten() for s in states]) / (1 - beta1**step)
        v_hat = torch.cat([s["exp_avg_sq"].flatten() for s in states]) / (1 - beta2**step)
        ratio = m_hat.abs() / (v_hat.sqrt() + eps)
        weights = torch.cat([p.detach().flatten() for p in params])
        out[f"{name}_sqrt_v_median"] = float(v_hat.sqrt().median())
        out[f"{name}_step_ratio"] = float(ratio.mean())
        out[f"{name}_update_rms"] = float(lr * ratio.pow(2).mean().sqrt())
        out[f"{name}_weight_rms"] = float(weights.pow(2).mean().sqrt())
    return out


def cmd_run(args: argparse.Namespace) -> int:
    from benchmarks.learning.__main__ import parse_overrides
    from learner.tools.synchronous import train_synchronously
    from seedrl.config import LearnerConfig
    from seedrl.presets import build_config

    fields = {"env": args.env, "seed": args.seed, "logdir": str(Path(args.out).with_suffix(""))}
    fields.update(tensorboard=False, progress="off", **parse_overrides(args.overrides))
    config = build_config(LearnerConfig, fields)
    out = open(args.out, "w", buffering=1)  # noqa: SIM115 - closed below, whatever happens
    sums: dict[str, float] = {}
    count, solved, start = 0, False, time.perf_counter()

    def on_batch(trainer: Any, stats: Any, results: list[dict[str, float] | None]) -> bool:
        nonlocal count, solved
        groups = parameter_groups(trainer.model)
        for scalars in results:
            if scalars is None:
                continue
            for key, value in {**scalars, **adam_diagnostics(trainer.optimizer, groups)}.items():
                sums[key] = sums.get(key, 0.0) + value
            count += 1
        if count < args.every:
            return False
        record = {k: v / count for k, v in sums.items()}
        record["frames"], record["ret100"] = stats.frames, stats.return_mean
        record["steps"], record["wall_s"] = trainer.step_counter.value, time.perf_counter() - start
        out.write(json.dumps(record) + "\n")
        sums.clear()
        count = 0
        ret = stats.full_window_mean
        solved = solved or (ret is not None and ret >= args.solved)
        return bool(args.stop_below and solved and ret is not None and ret < args.stop_below)

    try:
        train_synchronously(config, args.envs, args.frames, on_batch)
    finally:
        out.close()
    return 0


def read_records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def cmd_plot(args: argparse.Namespace) -> int:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.ticker import EngFormatter

    runs = [(Path(p).stem, read_records(Path(p))) for p in args.files]
    labels = args.labels or [name for name, _ in runs]
    if len(labels) != len(runs):
        raise SystemExit(f"error: {len(labels)} --label for {len(runs)} files")
    rows = -(-len(PANELS) // 3)
    fig, axes = plt.subplots(rows, 3, figsize=(15, 3.2 * rows), sharex=True,
                             constrained_layout=True)  # fmt: skip
    for ax, (key, title, log) in zip(axes.flat, PANELS, strict=False):
        for label, (_, records) in zip(labels, runs, strict=True):
            points = [(r["frames"], r[key]) for r in records if r.get(key) is not None]
            ax.plot([p[0] for p in points], [p[1] for p in points], linewidth=0.8, label=label)
        ax.set_title(title)
        if log:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    axes.flat[0].legend(fontsize=8)
    for ax in axes[-1]:
        ax.set_xlabel("frames")
    if args.title:
        fig.suptitle(args.title)
    Path(args.png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.png, dpi=80)
    print(f"wrote {args.png}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.learning.probe",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="a synchronous run that records what Adam does")
    run.add_argument("--env", default="CartPole-v1")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--envs", type=int, default=64, help="envs stepped together")
    run.add_argument("--frames", type=int, default=20_000_000)
    run.add_argument("--every", type=int, default=10, help="optimizer steps per record")
    run.add_argument("--solved", type=float, default=475.0, help="the solved mean-100 return")
    run.add_argument("--stop-below", type=float, default=0.0,
                     help="end the run once solved and then below this (0: never)")  # fmt: skip
    run.add_argument("--out", required=True, help="the JSONL file to write")
    run.add_argument("--set", dest="overrides", action="append", default=[],
                     metavar="FIELD=VALUE", help="a learner config field (repeatable)")  # fmt: skip
    plot = sub.add_parser("plot", help="the probe's records as one PNG of panels")
    plot.add_argument("files", nargs="+")
    plot.add_argument("--png", required=True)
    plot.add_argument("--label", dest="labels", action="append", default=[],
                      help="legend label of each file, in order (repeatable)")  # fmt: skip
    plot.add_argument("--title", default="")
    args = parser.parse_args(argv)
    if args.command == "run":
        if args.every < 1 or args.envs < 1 or args.frames < 1:
            parser.error("--every, --envs and --frames must be >= 1")
        return cmd_run(args)
    return cmd_plot(args)


if __name__ == "__main__":
    sys.exit(main())
