"""Elo ratings over a self-play run, from metrics.jsonl (``elo_<player>`` keys), as a PNG.

Left: each player's rating against learner steps: the learner's line, a labelled line per
fixed opponent (``--fixed-opponents``), and a thin line per snapshot from the record where
it first appears (one log interval at most after it was frozen). Right: each snapshot's
last logged rating against the step it first appeared, the view in which a learner that
keeps improving shows as a rising line of snapshots.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from learner.league.league import ELO_PREFIX
from learner.league.ratings import LEARNER
from seedrl.metrics import read_metrics

PNG_NAME = "ratings.png"
SNAPSHOT_PLAYER = "snapshot_"
"""How a snapshot's player name starts in the metric keys (``elo_snapshot_3``)."""
FIXED_COLORS = ("tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")
"""Fixed opponents' lines: none in the learner's blue or the snapshots' grey."""


@dataclasses.dataclass
class RatingSeries:
    """One player's rating at each record that carries it."""

    steps: np.ndarray
    ratings: np.ndarray

    @property
    def first_step(self) -> int:
        return int(self.steps[0])

    @property
    def last(self) -> float:
        return float(self.ratings[-1])


def rating_history(records: list[dict[str, Any]]) -> dict[str, RatingSeries]:
    """Player -> its rating series over ``learner_steps``, in order of first appearance."""
    points: dict[str, tuple[list[int], list[float]]] = {}
    for record in records:
        step = int(record.get("learner_steps", 0))
        for key, value in record.items():
            if key.startswith(ELO_PREFIX) and value is not None:
                steps, ratings = points.setdefault(key[len(ELO_PREFIX) :], ([], []))
                steps.append(step)
                ratings.append(float(value))
    return {
        player: RatingSeries(np.array(s, dtype=np.int64), np.array(r, dtype=np.float64))
        for player, (s, r) in points.items()
    }


def has_ratings(logdir: str | Path) -> bool:
    return any(k.startswith(ELO_PREFIX) for r in read_metrics(logdir) for k in r)


def plot_ratings(logdir: str | Path, out: str | Path | None = None) -> Path:
    """Render the ratings of ``logdir``'s run; returns the PNG path."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.ticker import EngFormatter

    logdir = Path(logdir)
    history = rating_history(read_metrics(logdir))
    if not history:
        raise ValueError(f"{logdir}: no {ELO_PREFIX}* ratings in metrics.jsonl to plot")
    snapshots = {p: s for p, s in history.items() if p.startswith(SNAPSHOT_PLAYER)}
    fixed = {p: s for p, s in history.items() if p != LEARNER and p not in snapshots}
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), constrained_layout=True)
    ax = axes[0]
    for series in snapshots.values():
        ax.plot(series.steps, series.ratings, color="tab:gray", alpha=0.4, linewidth=0.8)
    if LEARNER in history:
        learner = history[LEARNER]
        ax.plot(learner.steps, learner.ratings, color="tab:blue", linewidth=2, label=LEARNER)
    for (player, series), color in zip(fixed.items(), FIXED_COLORS * len(fixed), strict=False):
        ax.plot(series.steps, series.ratings, color=color, linewidth=1.5, linestyle="--",
                label=player)  # fmt: skip
    if LEARNER in history or fixed:
        ax.legend(loc="upper left")
    ax.set_title("Elo vs learner steps (grey: snapshots)")
    ax.set_ylabel("Elo")
    ax = axes[1]
    if snapshots:
        order = sorted(snapshots.values(), key=lambda s: s.first_step)
        ax.plot([s.first_step for s in order], [s.last for s in order], "o-", color="tab:purple",
                markersize=3)  # fmt: skip
    ax.set_title("each snapshot's latest Elo vs the step it was frozen")
    for ax in axes:
        ax.set_xlabel("learner steps")
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    fig.suptitle(f"seedrl - ratings - {logdir.name}")
    path = Path(out) if out else logdir / PNG_NAME
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
