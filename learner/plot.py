"""``python -m learner plot LOGDIR``: the learning curve of a run as a PNG (matplotlib)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from seedrl.metrics import read_metrics

PNG_NAME = "learning_curve.png"


def plot_run(logdir: str | Path, out: str | Path | None = None) -> Path:
    """Render return vs frames, return vs wall time and fps vs frames; returns the PNG path."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    logdir = Path(logdir)
    records = read_metrics(logdir)
    if not records:
        raise ValueError(f"{logdir}: no metrics.jsonl records to plot")
    with_return = [r for r in records if r.get("episode_return_mean") is not None]
    frames = [r["frames"] for r in with_return]
    returns = [r["episode_return_mean"] for r in with_return]
    minutes = [r["elapsed_s"] / 60 for r in with_return]
    env = _env_name(logdir)

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), constrained_layout=True)
    ax = axes[0]
    ax.plot(frames, returns, color="tab:blue")
    ax.set_xlabel("env frames")
    ax.set_ylabel("mean episode return (last 100)")
    ax.set_title("return vs frames")
    ax = axes[1]
    ax.plot(minutes, returns, color="tab:green")
    ax.set_xlabel("wall time (min)")
    ax.set_ylabel("mean episode return (last 100)")
    ax.set_title("return vs wall time")
    ax = axes[2]
    ax.plot([r["frames"] for r in records], [r["fps"] for r in records], color="tab:orange")
    ax.set_xlabel("env frames")
    ax.set_ylabel("frames / s")
    ax.set_title("throughput")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 4))
    fig.suptitle(f"seedrl - {env} - {logdir.name}")
    path = Path(out) if out else logdir / PNG_NAME
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _env_name(logdir: Path) -> str:
    try:
        return str(json.loads((logdir / "config.json").read_text())["env"])
    except (OSError, KeyError, ValueError):
        return "?"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m learner plot", description=__doc__)
    parser.add_argument("logdir", help="a learner log directory (holds metrics.jsonl)")
    parser.add_argument("--out", help=f"PNG path (default: LOGDIR/{PNG_NAME})")
    args = parser.parse_args(argv)
    print(plot_run(args.logdir, args.out))
    return 0
