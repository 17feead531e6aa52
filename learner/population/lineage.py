"""A population run's lineage as a PNG (matplotlib), from its metrics.jsonl: each member's
recent return (top) and each perturbed hyperparameter (one panel each, log scale) against
the learner's frames, one colour per member, with a marker where a member copied another
(at its new value) and a dot at the value it copied."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from learner.population.pbt import COPIED_KEY, EVENT_KEY, PBT_PREFIX
from seedrl.metrics import read_metrics

PNG_NAME = "lineage.png"


@dataclasses.dataclass
class Lineage:
    """What the plot draws: per member, per key (``return`` or a hyperparameter), the
    (frames, value) points; and the exploit events in order."""

    series: dict[str, dict[str, tuple[list[int], list[float]]]]
    events: list[dict[str, Any]]

    @property
    def params(self) -> list[str]:
        keys = {key for member in self.series.values() for key in member}
        return sorted(keys - {"return", COPIED_KEY})


def lineage_of(records: list[dict[str, Any]]) -> Lineage:
    """The lineage in a run's metrics records (``pbt/NAME/KEY`` and :data:`EVENT_KEY`)."""
    series: dict[str, dict[str, tuple[list[int], list[float]]]] = {}
    events: list[dict[str, Any]] = []
    for record in records:
        frames = int(record.get("frames", 0))
        for key, value in record.items():
            if not key.startswith(PBT_PREFIX) or value is None or key.count("/") != 2:
                continue
            _, member, name = key.split("/")
            xs, ys = series.setdefault(member, {}).setdefault(name, ([], []))
            xs.append(frames)
            ys.append(float(value))
        events.extend(record.get(EVENT_KEY, []))
    return Lineage(series, events)


def has_lineage(logdir: str | Path) -> bool:
    return any(lineage_of(read_metrics(logdir)[-1:]).series.values())


def plot_lineage(logdir: str | Path, out: str | Path | None = None) -> Path:
    """Write the lineage plot of the run in ``logdir`` (default ``LOGDIR/lineage.png``);
    ValueError when its metrics hold no population."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.ticker import EngFormatter

    logdir = Path(logdir)
    lineage = lineage_of(read_metrics(logdir))
    if not lineage.series:
        raise ValueError(f"{logdir}: no population in metrics.jsonl to plot")
    keys = ["return", *lineage.params]
    fig, axes = plt.subplots(
        len(keys), 1, figsize=(10, 2.6 * len(keys)), sharex=True, constrained_layout=True
    )
    axes = list(axes) if len(keys) > 1 else [axes]
    colors = {member: f"C{index % 10}" for index, member in enumerate(sorted(lineage.series))}
    for ax, key in zip(axes, keys, strict=True):
        for member, own in sorted(lineage.series.items()):
            if key in own:
                ax.plot(*own[key], color=colors[member], label=member, linewidth=1.2)
        for event in lineage.events:
            value = event["return"] if key == "return" else event["values"].get(key)
            source = None if key == "return" else event.get("copied_values", {}).get(key)
            if value is None:
                continue
            color = colors.get(event["member"], "black")
            ax.scatter([event["frames"]], [value], marker="v", color=color, zorder=3, s=24)
            if key != "return" and source is not None:
                ax.scatter([event["frames"]], [source], marker="o", s=10, zorder=3,
                           color=colors.get(event["copied"], "black"))  # fmt: skip
        ax.set_ylabel("recent return" if key == "return" else key)
        if key != "return":
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="upper left", ncol=min(4, len(lineage.series)), fontsize="small")
    axes[0].set_title(
        f"population lineage - {len(lineage.events)} exploits (v: a member copied another)"
    )
    axes[-1].set_xlabel("env frames (all members)")
    axes[-1].xaxis.set_major_formatter(EngFormatter(sep=""))
    path = Path(out) if out else logdir / PNG_NAME
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
