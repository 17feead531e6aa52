"""The learner's live counters, turned into one metrics record per log interval."""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from learner.state.trajectories import FinishedEpisodes
from seedrl.timing import PhaseTimer, process_rss_mb

T = TypeVar("T")

RETURN_WINDOW = 100
"""Episodes in the moving mean (the CartPole 'solved' criterion uses the last 100)."""
SERVING_PHASES = (
    "decode", "batch_assembly", "forward", "trajectory_write", "trainer_handoff", "reply",
)  # fmt: skip
"""The serving path's phases, in the order a frame meets them (``--time-phases``)."""


class ServingPhases:
    """Running seconds per serving phase on the event-loop thread (``--time-phases``).

    Per batch, the engine calls ``begin`` and then ``mark(phase)`` at the end of each
    phase (the thread's CPU time since the previous mark goes to that phase: a forward
    pass preempted by other processes, or a wait on a lock, counts only what it ran);
    per message, the servicer's decode and reply functions are wrapped with ``timed``,
    on the wall clock, which costs a tenth of a thread-CPU read and equals the CPU of a
    section that short unless the thread was preempted inside it.
    """

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(SERVING_PHASES, 0.0)
        self._batch_clock = time.thread_time
        self._message_clock = time.perf_counter
        self._last = 0.0

    def begin(self) -> None:
        self._last = self._batch_clock()

    def mark(self, phase: str) -> None:
        now = self._batch_clock()
        self.seconds[phase] += now - self._last
        self._last = now

    def timed(self, phase: str, fn: Callable[..., T]) -> Callable[..., T]:
        """``fn`` with its (wall) time added to ``phase``."""
        seconds, clock = self.seconds, self._message_clock

        def run(*args: Any) -> T:
            began = clock()
            try:
                return fn(*args)
            finally:
                seconds[phase] += clock() - began

        return run


def _ignore(phase: str = "") -> None:
    """The phase marks when phases are not timed."""


class LearnerStats:
    """Counters written by the event loop (frames, episodes) and the trainer (losses)."""

    def __init__(self, log_episodes: bool = False, time_phases: bool = False) -> None:
        self.phases = ServingPhases() if time_phases else None
        """Seconds per serving phase, with ``--time-phases``."""
        self.frames = 0
        self.episodes = 0
        self.frames_dropped = 0
        self.actors_connected = 0
        self.streams_rejected = 0
        self.streams_timed_out = 0
        self.streams_invalid = 0
        """Streams ended with INVALID_ARGUMENT: a bad Hello or a bad frame."""
        self.learner_steps = 0
        self.nonfinite_skipped = 0
        self.returns: collections.deque[float] = collections.deque(maxlen=RETURN_WINDOW)
        self.return_first: float | None = None
        """The first mean return over a full window of episodes: where the run started."""
        self.return_best: float | None = None
        """The best mean return over a full window so far (checked once per record)."""
        self.lengths: collections.deque[int] = collections.deque(maxlen=RETURN_WINDOW)
        self.timer = PhaseTimer()
        self.sources: list[Callable[[], dict[str, float]]] = []
        """Counts kept in other processes (serving-tier frontends'), added to the record's
        keys of the same name, so the metrics read alike with or without frontends."""
        self._lock = threading.Lock()
        self._train_sums: dict[str, float] = {}
        self._train_counts: dict[str, int] = {}
        """Steps that reported each key: a key some steps leave out (SAC's actor loss, on
        an update that delays the actor's step) is the mean of the steps that have it."""
        self._interval_batches = 0
        self._interval_batch_frames = 0
        self._last_time = time.perf_counter()
        self._last_frames = 0
        self._last_steps = 0
        self._start = time.perf_counter()
        self._start_frames = 0
        # (frames, elapsed_s, return_E, length_E) per batch that ended episodes, until
        # drained; kept only when a writer drains them, so nothing grows unread.
        self._ended: list[tuple[int, float, np.ndarray, np.ndarray]] | None = (
            [] if log_episodes else None
        )

    # ------------------------------------------------------------------ writers

    def on_batch(self, frames: int, episodes: FinishedEpisodes | None) -> None:
        self.frames += frames
        self._interval_batches += 1
        self._interval_batch_frames += frames
        if episodes is not None:
            self.on_episodes(episodes)

    def on_episodes(self, episodes: FinishedEpisodes) -> None:
        """Episodes that ended (with the batch that ended them, or as a serving tier's
        frontends report them)."""
        self.episodes += len(episodes.returns)
        self.returns.extend(episodes.returns.tolist())
        self.lengths.extend(episodes.lengths.tolist())
        if self._ended is not None:
            elapsed = time.perf_counter() - self._start
            self._ended.append((self.frames, elapsed, episodes.returns, episodes.lengths))

    def on_train_step(self, scalars: dict[str, float]) -> None:
        with self._lock:
            self.learner_steps += 1
            for key, value in scalars.items():
                self._train_sums[key] = self._train_sums.get(key, 0.0) + value
                self._train_counts[key] = self._train_counts.get(key, 0) + 1

    def restore(
        self,
        frames: int,
        steps: int,
        episodes: int,
        returns: list[float],
        return_first: float | None = None,
        return_best: float | None = None,
    ) -> None:
        """Continue counting from a checkpoint."""
        self.frames = self._last_frames = self._start_frames = frames
        self.learner_steps = self._last_steps = steps
        self.episodes = episodes
        self.returns.extend(returns)
        self.return_first, self.return_best = return_first, return_best

    def phase_marks(self) -> tuple[Callable[[], None], Callable[[str], None]]:
        """(begin, mark) of the serving phases; they do nothing unless phases are timed."""
        if self.phases is None:
            return _ignore, _ignore
        return self.phases.begin, self.phases.mark

    # ------------------------------------------------------------------ readers

    def drain_episodes(self) -> list[tuple[int, float, np.ndarray, np.ndarray]]:
        """The episodes that ended since the last call, per batch: (frames at its end,
        seconds since start, returns, lengths); empty unless built with ``log_episodes``."""
        if not self._ended:
            return []
        ended, self._ended = self._ended, []
        return ended

    @property
    def return_mean(self) -> float | None:
        return float(np.mean(self.returns)) if self.returns else None

    @property
    def full_window_mean(self) -> float | None:
        """The mean return of the last RETURN_WINDOW episodes; None until there are as many."""
        return self.return_mean if len(self.returns) >= RETURN_WINDOW else None

    @property
    def return_error(self) -> float:
        """The standard error of :attr:`return_mean` (0 with under two episodes)."""
        n = len(self.returns)
        return float(np.std(self.returns, ddof=1) / math.sqrt(n)) if n > 1 else 0.0

    @property
    def return_spread(self) -> float | None:
        """The standard deviation of the window's returns; None until it is full (what a
        gain is measured against when the collapse watch asks how far the run has come)."""
        if len(self.returns) < RETURN_WINDOW:
            return None
        return float(np.std(self.returns, ddof=1))

    def _track_best(self) -> None:
        mean = self.full_window_mean
        if mean is None:
            return
        if self.return_first is None:
            self.return_first = mean
        if self.return_best is None or mean > self.return_best:
            self.return_best = mean

    def snapshot(self, queue_unrolls: int = 0) -> dict[str, Any]:
        """One metrics record; rates and means cover the time since the previous one."""
        now = time.perf_counter()
        dt = max(now - self._last_time, 1e-9)
        with self._lock:
            train = {k: v / self._train_counts[k] for k, v in self._train_sums.items()}
            self._train_sums, self._train_counts = {}, {}
            steps = self.learner_steps
        phases = self.timer.drain()
        self._track_best()
        record: dict[str, Any] = {
            "time": time.time(),
            "elapsed_s": now - self._start,
            "frames": self.frames,
            "fps": (self.frames - self._last_frames) / dt,
            "fps_mean": (self.frames - self._start_frames) / max(now - self._start, 1e-9),
            "episodes": self.episodes,
            "episode_return_mean": self.return_mean,
            "episode_return_best": self.return_best,
            "episode_length_mean": float(np.mean(self.lengths)) if self.lengths else None,
            "actors_connected": self.actors_connected,
            "inference_batch_mean": (
                self._interval_batch_frames / self._interval_batches
                if self._interval_batches
                else 0.0
            ),
            "inference_batches_per_s": self._interval_batches / dt,
            "learner_steps": steps,
            "learner_steps_per_s": (steps - self._last_steps) / dt,
            "trainer_wait_share": phases.get("trainer_wait_data", 0.0) / dt,
            "inference_wait_share": phases.get("inference_wait_trainer", 0.0) / dt,
            "queue_unrolls": queue_unrolls,
            "frames_dropped": self.frames_dropped,
            "streams_rejected": self.streams_rejected,
            "streams_timed_out": self.streams_timed_out,
            "streams_invalid": self.streams_invalid,
            "nonfinite_skipped": self.nonfinite_skipped,
            "learner_rss_mb": process_rss_mb(),
        }
        for source in self.sources:
            for key, value in source().items():
                record[key] = record.get(key, 0) + value
        record.update(train)
        if self.phases is not None:
            record.update({f"phase_s/{k}": v for k, v in self.phases.seconds.items()})
        self._last_time, self._last_frames, self._last_steps = now, self.frames, steps
        self._interval_batches = self._interval_batch_frames = 0
        return record
