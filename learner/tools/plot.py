"""``python -m learner plot LOGDIR``: the learning curve of a run as a PNG (matplotlib),
and for a self-play run its Elo ratings beside it (:mod:`learner.league.plot`).

The return is drawn per episode from ``episodes.jsonl`` when the run kept it (the
default), so the curve starts at the first finished episode; else from the metrics
records, one point per log interval.
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from learner.state.stats import RETURN_WINDOW
from seedrl.metrics import read_episodes, read_metrics

PNG_NAME = "learning_curve.png"
MAX_DOTS = 4000
"""Episodes drawn as dots at most; a longer run shows an even sample."""


@dataclass
class ReturnCurve:
    """Return over the run, one point per episode (episodes.jsonl) or, for runs without
    that file, per metrics record; ``episodes`` says which. ``mean`` is the mean of the
    last :data:`RETURN_WINDOW` episodes at each point (what ``episode_return_mean`` and
    the solved criterion use), ``raw`` each episode's own return (None from records)."""

    frames: np.ndarray
    elapsed_s: np.ndarray
    mean: np.ndarray
    raw: np.ndarray | None

    @property
    def episodes(self) -> bool:
        return self.raw is not None


def return_curve(logdir: str | Path) -> ReturnCurve:
    """The run's return curve, from its first finished episode when it kept episodes.jsonl."""
    episodes = read_episodes(logdir)
    if episodes:
        raw = np.array([e["return"] for e in episodes], dtype=np.float64)
        return ReturnCurve(
            frames=np.array([e["frames"] for e in episodes], dtype=np.int64),
            elapsed_s=np.array([e["elapsed_s"] for e in episodes], dtype=np.float64),
            mean=trailing_mean(raw, RETURN_WINDOW),
            raw=raw,
        )
    records = [r for r in read_metrics(logdir) if r.get("episode_return_mean") is not None]
    return ReturnCurve(
        frames=np.array([r["frames"] for r in records], dtype=np.int64),
        elapsed_s=np.array([r["elapsed_s"] for r in records], dtype=np.float64),
        mean=np.array([r["episode_return_mean"] for r in records], dtype=np.float64),
        raw=None,
    )


def trailing_mean(x: np.ndarray, window: int) -> np.ndarray:
    """At each i, the mean of ``x[max(0, i - window + 1) : i + 1]``."""
    total = np.concatenate(([0.0], np.cumsum(x, dtype=np.float64)))
    end = np.arange(1, len(x) + 1)
    start = np.maximum(0, end - window)
    return (total[end] - total[start]) / (end - start)


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

    curve = return_curve(logdir)
    long_run = records[-1].get("elapsed_s", 0.0) >= 180
    time_unit, time_scale = ("min", 60.0) if long_run else ("s", 1.0)
    wall = curve.elapsed_s / time_scale
    # Every episode drawn is one dot; beyond a few thousand they are one blur, so a long
    # run shows an even sample of them (the mean line keeps every point).
    dots = slice(None, None, max(1, len(curve.frames) // MAX_DOTS))
    # fps of intervals where frames flowed (the first record and the one written at
    # shutdown cover moments without actors and would draw false drops to zero)
    flowing = [b for a, b in itertools.pairwise(records) if b["frames"] > a["frames"]]
    env = _env_name(logdir)

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), constrained_layout=True)
    for ax, x, color, label in (
        (axes[0], curve.frames, "tab:blue", "env frames"),
        (axes[1], wall, "tab:green", f"wall time ({time_unit})"),
    ):
        if curve.raw is not None:
            ax.scatter(x[dots], curve.raw[dots], s=4, color=color, alpha=0.25, linewidths=0,
                       label="episode return")  # fmt: skip
        ax.plot(x, curve.mean, color=color, label=f"mean of last {RETURN_WINDOW}")
        ax.set_xlabel(label)
        ax.set_ylabel("episode return")
        if curve.raw is not None:
            ax.legend(loc="upper left")
    axes[0].set_title("return vs frames")
    axes[1].set_title("return vs wall time")
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
    from learner.league import plot as league_plot

    if league_plot.has_ratings(args.logdir):  # a self-play run: its Elo ratings too
        print(league_plot.plot_ratings(args.logdir))
    from learner.population import lineage

    if lineage.has_lineage(args.logdir):  # a population: each member's values and return
        print(lineage.plot_lineage(args.logdir))
    return 0
