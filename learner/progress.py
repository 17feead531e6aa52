"""The learner's live progress: a rich bar on a terminal, plain lines otherwise."""

from __future__ import annotations

import sys
from typing import Any

from learner.collapse import ENTROPY_FLAG, PREMATURE_FLAG, RETURN_FLAG
from learner.population.pbt import EVENT_KEY, describe_event


def _fmt(value: Any, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def progress_line(record: dict[str, Any]) -> str:
    """One human line for a metrics record; a collapse flag (``learner.collapse``) adds a
    warning to it for as long as it stands."""
    line = (
        f"frames {record['frames']:>10,d}  fps {record['fps']:>8,.0f}  "
        f"episodes {record['episodes']:>7,d}  return {_fmt(record['episode_return_mean']):>6}  "
        f"actors {record['actors_connected']:>3d}  batch {record['inference_batch_mean']:>5.1f}  "
        f"steps {record['learner_steps']:>6,d}"
    )
    if "selfplay_win_rate" in record:  # --self-play: the recent games against the pool
        line += (
            f"  win/draw/loss {record['selfplay_win_rate']:.0%}/{record['selfplay_draw_rate']:.0%}"
            f"/{record['selfplay_loss_rate']:.0%}  elo {record['elo_learner']:.0f}"
        )
    if EVENT_KEY in record:  # --population: who copied whom this interval, the new values
        line += "  pbt " + "; ".join(describe_event(event) for event in record[EVENT_KEY])
    warnings = []
    if record.get(ENTROPY_FLAG):
        warnings.append(f"entropy {record.get('entropy_fraction', 0.0):.1%} of max")
    if record.get(RETURN_FLAG):
        warnings.append(f"return fell from best {_fmt(record.get('episode_return_best'))}")
    if warnings:
        line += "  COLLAPSE? " + ", ".join(warnings)
    if record.get(PREMATURE_FLAG):
        fraction = record.get("entropy_fraction", 0.0)
        line += f"  PREMATURE? entropy {fraction:.0%} of max, return near its start"
    return line


class Progress:
    """``bar`` (rich, live-updating), ``plain`` (one printed line per update) or ``off``."""

    def __init__(
        self, mode: str, total_frames: int = 0, target_return: float | None = None
    ) -> None:
        if mode == "auto":
            mode = "bar" if sys.stdout.isatty() else "plain"
        self.mode = mode
        self.target_return = target_return
        self._rich: Any = None
        self._task: Any = None
        if mode == "bar":
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._rich = Progress(
                TextColumn("[bold]seedrl"),
                BarColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                refresh_per_second=4,
            )
            total = total_frames if total_frames else (target_return or None)
            self._by_return = not total_frames and target_return is not None
            self._task = self._rich.add_task("starting", total=total)
            self._rich.start()

    def update(self, record: dict[str, Any]) -> None:
        line = progress_line(record)
        if self.mode == "plain":
            print(line, flush=True)
        elif self._rich is not None:
            done = record["frames"]
            if self._by_return:
                done = max(0.0, record["episode_return_mean"] or 0.0)
            self._rich.update(self._task, completed=done, description=line)

    def close(self) -> None:
        if self._rich is not None:
            self._rich.stop()
            self._rich = None
