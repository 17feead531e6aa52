"""Schedules: a hyper-parameter as a function of the frames trained so far.

Each is a small strategy object with one method, chosen from the config once, so the
trainer and the loss read a value per step without knowing which schedule it is. Their
clock is the frames trained on before an optimizer step, each counted once however often
a replay hands it back (``step * frames_per_step``), a function of the step count alone,
which checkpoints keep: a resumed run continues every schedule exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from seedrl.config import LearnerConfig


@dataclass(frozen=True)
class StepClock:
    """Where training is: the optimizer step about to be taken and the frames before it."""

    step: int
    frames: float


class Schedule(Protocol):
    def __call__(self, frames: float) -> float:
        """The value after ``frames`` frames trained on."""
        ...


@dataclass(frozen=True)
class Constant:
    value: float

    def __call__(self, frames: float) -> float:
        return self.value


@dataclass(frozen=True)
class Linear:
    """From ``start`` to ``end`` over ``total_frames``, held at ``start`` for the first
    ``hold`` share of them, then at ``end``."""

    start: float
    end: float
    total_frames: int
    hold: float = 0.0

    def __call__(self, frames: float) -> float:
        done = min(1.0, frames / self.total_frames)
        remaining = min(1.0, (1.0 - done) / (1.0 - self.hold))  # share of the way left
        return self.end + (self.start - self.end) * remaining


@dataclass(frozen=True)
class InverseSqrt:
    """``start`` for the first ``hold_frames``, then ``start * sqrt(hold_frames / frames)``:
    no end in view, yet the squared steps add up like a harmonic series, so the random walk
    that noisy updates make of a solved policy spreads only logarithmically."""

    start: float
    hold_frames: int

    def __call__(self, frames: float) -> float:
        return self.start * min(1.0, math.sqrt(self.hold_frames / max(frames, 1.0)))


def learning_rate_schedule(config: LearnerConfig) -> Schedule:
    """``--lr-schedule``: constant; linear to 0 at ``--total-frames`` from
    ``--lr-decay-start`` of them on; or inverse-sqrt after ``--lr-hold-frames``."""
    schedule = config.effective_lr_schedule
    if schedule == "constant":
        return Constant(config.learning_rate)
    if schedule == "inverse_sqrt":
        return InverseSqrt(config.learning_rate, config.lr_hold_frames)
    return Linear(config.learning_rate, 0.0, config.total_frames, config.lr_decay_start)


def entropy_cost_schedule(config: LearnerConfig) -> Schedule:
    """``--entropy-cost``, or with ``--final-entropy-cost`` the line from one to the other
    over ``--total-frames``."""
    if config.final_entropy_cost is None:
        return Constant(config.entropy_cost)
    return Linear(config.entropy_cost, config.final_entropy_cost, config.total_frames)
