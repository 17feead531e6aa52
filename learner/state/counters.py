"""Small counters shared between the learner's threads."""

from __future__ import annotations


class StepCounter:
    """Learner steps, written by the trainer and read by inference (an int is atomic)."""

    def __init__(self, value: int = 0) -> None:
        self.value = value
