"""``python -m learner plot LOGDIR``: the learning curve of a run as a PNG (matplotlib)."""

from __future__ import annotations

import argparse
import itertools
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
    from matplotlib.ticker import EngFormatter

    with_return = [r for r in records if r.get("episode_return_mean") is not None]
    frames = [r["frames"] for r in with_return]
    returns = [r["episode_return_mean"] for r in with_return]
    long_run = records[-1].get("elapsed_s", 0.0) >= 180
    time_unit, time_scale = ("min", 60.0) if long_run else ("s", 1.0)
    wall = [r["elapsed_s"] / time_scale for r in with_return]
    # fps of intervals where frames flowed (the first record and the one written at
    # shutdown cover moments without actors and would draw false drops to zero)
    flowing = [b for a, b in itertools.pairwise(records) if b["frames"] > a["frames"]]
    env = _env_name(logdir)

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), constrained_layout=True)
    ax = axes[0]
    ax.plot(frames, returns, color="tab:blue")
    ax.set_xlabel("env frames")
    ax.set_ylabel("mean episode return (last 100)")
    ax.set_title("return vs frames")
    ax = axes[1]
    ax.plot(wall, returns, color="tab:green")
    ax.set_xlabel(f"wall time ({time_unit})")
    ax.set_ylabel("mean episode return (last 100)")
    ax.set_title("return vs wall time")
    ax = axes[2]
    ax.plot([r["frames"] for r in flowing], [r["fps"] for r in flowing], color="tab:orange",
            label="per interval")  # fmt: skip
    if flowing and "fps_mean" in flowing[-1]:
        ax.plot([r["frames"] for r in flowing], [r["fps_mean"] for r in flowing],
                color="tab:gray", linestyle="--", label="run mean")  # fmt: skip
        ax.legend(loc="lower right")
    ax.set_xlabel("env frames")
    ax.set_ylabel("env frames / s")
    ax.set_title("throughput")
    ax.set_ylim(bottom=0)
    for ax in axes:
        ax.grid(alpha=0.3)
    for ax in (axes[0], axes[2]):
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    axes[2].yaxis.set_major_formatter(EngFormatter(sep=""))
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
