"""What a running learner checkpoints, when, and where, in one place.

- ``checkpoint.pt`` every ``--checkpoint-interval-s`` and at the run's end; the replay
  beside it (``replay.npz``, with ``--replay-checkpoint``) on the periodic checkpoints
  :class:`ReplayCadence` picks; with ``--checkpoint-history-frames``, the first
  checkpoint past each multiple kept for good as a hard link ``checkpoints/frames-N.pt``.
- ``checkpoint-best.pt`` when the run's measure is at a new best (:class:`BestKeeper`).
- Every file is renamed into place only while the learner's lease of the run directory
  holds (:mod:`learner.state.files`), and only by the learner (or the torchrun rank) that
  writes checkpoints.

:class:`Checkpointer` takes the training state from a callable (a trainer host's
``training_state``), so it knows no model, optimizer or host; the file format, reading
and ``--resume`` are :mod:`learner.state.checkpoint`'s.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from learner.common.measures import BY_RETURN, BY_YARDSTICK
from learner.metrics import one_line
from learner.state import checkpoint
from learner.state.files import Lease, NotOwner, atomic_file
from learner.state.stats import LearnerStats
from seedrl.config import LearnerConfig, to_json_dict
from seedrl.proto import seedrl_pb2 as pb

log = logging.getLogger(__name__)

Clock = Callable[[], float]
"""Seconds on a clock that never goes back."""


class BestKeeper:
    """When to write checkpoint-best.pt: the run's ``measure`` (the mean return of a full
    window of the last 100 episodes, or in self-play with fixed opponents the yardstick
    score against them) beats the value it was last written with, and ``interval_s`` has
    passed since (so a long climb does not write a checkpoint at every log interval)."""

    def __init__(
        self,
        path: Path,
        interval_s: float,
        best: float = -math.inf,
        measure: str = BY_RETURN,
        clock: Clock = time.monotonic,
    ) -> None:
        self.path = path
        self.interval_s = interval_s
        self.best = best
        """The value of ``measure`` checkpoint-best.pt holds (-inf: none yet)."""
        self.measure = measure
        self.clock = clock
        self._last = -math.inf

    @classmethod
    def for_config(cls, config: LearnerConfig, clock: Clock = time.monotonic) -> BestKeeper | None:
        """The keeper of this run (None when --best-checkpoint-interval-s is 0); a resumed
        run goes on from the best its checkpoint-best.pt holds, a fresh one starts over."""
        if not config.best_checkpoint_interval_s:
            return None
        path = config.best_checkpoint_path
        measure = BY_YARDSTICK if config.self_play and config.fixed_opponents else BY_RETURN
        best = -math.inf
        if config.resume and path.is_file():
            try:
                state = checkpoint.load(path)
            except checkpoint.CheckpointError as exc:
                log.warning("%s; a new best checkpoint will replace it", exc)
            else:  # a best by another measure is no bar to this run's
                if state.get(checkpoint.BEST_MEASURE, BY_RETURN) == measure:
                    best = float(state.get(checkpoint.BEST_RETURN, -math.inf))
        return cls(path, config.best_checkpoint_interval_s, best, measure, clock)

    def due(self, value: float | None, final: bool = False) -> bool:
        """Whether the measure's ``value`` now (None: no full window yet) is to be kept
        now; ``final``: the run ends, so the interval does not hold it back."""
        if value is None or not value > self.best:
            return False
        return final or self.clock() - self._last >= self.interval_s

    def written(self, value: float) -> None:
        self.best = value
        self._last = self.clock()


class ReplayCadence:
    """Which periodic checkpoints also write the replay (--replay-checkpoint-interval-s):
    the checkpoint's own cadence suits a model's MiBs, not a replay's GiBs."""

    def __init__(self, interval_s: float, start: float) -> None:
        self.interval_s = interval_s
        self._last = start

    def due(self, now: float) -> bool:
        return now - self._last >= self.interval_s

    def written(self, now: float) -> None:
        self._last = now


class SavedReplay(Protocol):
    """What the checkpointer needs of the unroll store (``learner.agents.base.Store``)."""

    def save(self, path: Path, lease: Lease | None = None) -> int:
        """Write what a resumed run should find in the store; the bytes written."""
        ...


Capture = Callable[[], checkpoint.TrainingState | None]
"""The training state now; None when there is none to save (the trainer process died)."""


class Checkpointer:
    """Writes a learner's checkpoints: the periodic one (:meth:`tick`), the best one, and
    the last ones at the run's end (:meth:`final`), each from the state it is given.

    ``capture`` gives the training state, ``counters`` the (frames, episodes) to record
    (None: ``stats``' own; a torchrun rank's are all ranks' totals), ``extra_state`` what
    else a resumed run needs, by checkpoint key (the observation normaliser, the league).
    ``writes``: this learner writes checkpoints at all (one torchrun rank does). ``clock``
    and ``start`` time the cadences.
    """

    def __init__(
        self,
        config: LearnerConfig,
        capture: Capture,
        stats: LearnerStats,
        env_spec: pb.EnvSpec,
        model_spec: dict[str, Any],
        store: SavedReplay,
        *,
        extra_state: Mapping[str, Callable[[], Any]] | None = None,
        counters: Callable[[], tuple[int, int] | None] = lambda: None,
        keeper: BestKeeper | None = None,
        yardstick: Callable[[], float | None] | None = None,
        lease: Lease | None = None,
        writes: bool = True,
        clock: Clock = time.perf_counter,
        start: float | None = None,
    ) -> None:
        self.config = config
        self.capture = capture
        self.stats = stats
        self.env_spec = env_spec
        self.model_spec = model_spec
        self.store = store
        self.extra_state = dict(extra_state or {})
        self.counters = counters
        self.keeper = keeper
        self.yardstick = yardstick
        """The league's score against its fixed opponents, for a keeper measured by it."""
        self.lease = lease
        self.writes = writes
        self.clock = clock
        start = clock() if start is None else start
        self._last_periodic = start
        self.replay = ReplayCadence(config.replay_checkpoint_interval_s, start)

    # ------------------------------------------------------------------ what is saved

    def state(
        self, training: checkpoint.TrainingState, counters: tuple[int, int] | None = None
    ) -> dict[str, Any]:
        """The checkpoint of ``training``: the run's counters, returns, config, env and
        model descriptions, schedules and extra state beside it."""
        stats = self.stats
        frames, episodes = counters or (stats.frames, stats.episodes)
        extra: dict[str, Any] = checkpoint.schedule_states(self.config)
        extra.update({key: provide() for key, provide in self.extra_state.items()})
        return checkpoint.snapshot(
            training,
            frames=frames,
            episodes=episodes,
            returns=list(stats.returns),
            config=to_json_dict(self.config),
            env_spec=self.env_spec.SerializeToString(),
            model_spec=self.model_spec,
            return_first=stats.return_first,
            return_best=stats.return_best,
            **extra,
        )

    # ------------------------------------------------------------------ where

    def write(
        self,
        training: checkpoint.TrainingState,
        counters: tuple[int, int] | None = None,
        best: float | None = None,
        best_measure: str = BY_RETURN,
        replay: bool = True,
    ) -> None:
        """Write the checkpoint of ``training`` now, whatever the cadence; an error
        (:class:`NotOwner` once another learner owns the directory) is raised.

        With ``best`` (the value of ``best_measure`` that makes it the best) it goes to
        checkpoint-best.pt instead, and checkpoint.pt and the history are left as they
        are. ``replay``: also write the replay (with --replay-checkpoint).
        """
        config, lease = self.config, self.lease
        state = self.state(training, counters)
        if best is not None:
            state[checkpoint.BEST_RETURN] = best
            state[checkpoint.BEST_MEASURE] = best_measure
            checkpoint.save(config.best_checkpoint_path, state, lease)
            return
        checkpoint.save(config.checkpoint_path, state, lease)
        if replay and config.replay_checkpoint:
            written = self.store.save(config.replay_path, lease)
            if written:
                log.info("replay written to %s (%.1f MiB)", config.replay_path, written / 2**20)
        self._keep_in_history(int(state["frames"]))

    def _keep_in_history(self, frames: int) -> None:
        """The first checkpoint past a multiple of --checkpoint-history-frames, for good."""
        latest, kept = self.config.checkpoint_path, self.config.history_checkpoint_path(frames)
        if kept is None or kept.exists():
            return
        kept.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:  # a link is atomic and free; the next save replaces checkpoint.pt, not it
            os.link(latest, kept)
        except OSError:  # a filesystem without hard links: copy, then rename into place
            with open(latest, "rb") as source:
                with atomic_file(kept, self.lease) as copy:
                    shutil.copyfileobj(source, copy)

    def save(
        self,
        counters: tuple[int, int] | None = None,
        best: float | None = None,
        best_measure: str = BY_RETURN,
        replay: bool = True,
    ) -> bool:
        """:meth:`write` the training state now; a dead trainer process leaves the last
        checkpoint, and a learner superseded by another leaves the leader's files as they
        are (each said in a log line). True once written; other errors are raised."""
        training = self.capture()
        if training is None:
            path = self.config.checkpoint_path if best is None else self.config.best_checkpoint_path
            log.error("no checkpoint written: the trainer process died; %s stays as it was", path)
            return False
        try:
            self.write(training, counters, best, best_measure, replay)
        except NotOwner as exc:  # the next supervision pass stops this learner
            log.error("no checkpoint written: %s", exc)
            return False
        return True

    # ------------------------------------------------------------------ when

    def best_value(self) -> float | None:
        """The value of the keeper's measure now: the mean-100 return, or the league's
        yardstick against its fixed opponents (None while neither has a full window)."""
        if self.keeper is not None and self.keeper.measure == BY_YARDSTICK:
            assert self.yardstick is not None, "a keeper by the yardstick needs a league"
            return self.yardstick()
        return self.stats.full_window_mean

    async def offer_best(self, final: bool = False) -> str | None:
        """Write checkpoint-best.pt when the keeper says its measure is at a new best; what
        failed, in a line, when it could not (None: written, or not due)."""
        keeper = self.keeper
        if keeper is None or not self.writes:
            return None
        value = self.best_value()
        if not keeper.due(value, final):
            return None
        assert value is not None
        try:
            counters = self.counters()
            if await asyncio.to_thread(self.save, counters, value, keeper.measure):
                keeper.written(value)
                return None
            return f"{keeper.path.name}: the trainer process died"
        except OSError as exc:  # as for checkpoint.pt: the run goes on, the old best stays
            log.error("could not write checkpoint %s: %s", keeper.path, exc)
            return f"{keeper.path.name}: {one_line(exc)}"

    def due(self, now: float) -> bool:
        """Whether the periodic checkpoint is due at ``now`` (on :attr:`clock`)."""
        return self.writes and now - self._last_periodic >= self.config.checkpoint_interval_s

    async def tick(self) -> None:
        """One supervision pass: the best checkpoint if its measure is at a new best, then
        checkpoint.pt (and the replay, when its own interval has passed) if due. A write
        that fails is logged and the run goes on: the old files stay whole."""
        await self.offer_best()
        now = self.clock()
        if not self.due(now):
            return
        try:
            counters = self.counters()
            replay = self.replay.due(now)
            if await asyncio.to_thread(self.save, counters, None, BY_RETURN, replay) and replay:
                self.replay.written(self.clock())
        except OSError as exc:  # a full disk should not end the run; the old one stays
            log.error("could not write checkpoint %s: %s", self.config.checkpoint_path, exc)
        self._last_periodic = self.clock()

    async def final(self) -> list[str]:
        """The run's last checkpoint and best one; what failed, in lines, never raised: the
        run's end still writes result.json (a full disk leaves the old checkpoints whole).
        A learner another has taken over from does not call it: its fence says so."""
        if not self.writes:
            return []
        failures = []
        path = self.config.checkpoint_path
        try:
            if not await asyncio.to_thread(self.save, self.counters()):
                failures.append(f"final checkpoint {path.name}: the trainer process died")
        except Exception as exc:
            log.error("could not write the final checkpoint %s: %s", path, exc)
            failures.append(f"final checkpoint {path.name}: {one_line(exc)}")
        try:
            best = await self.offer_best(final=True)
        except Exception as exc:
            log.error("could not write the final best checkpoint: %s", exc)
            best = f"final best checkpoint: {one_line(exc)}"
        return failures + ([best] if best else [])
