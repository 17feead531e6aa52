"""The serving-tier frontends' own counters, in the model process's metrics.

A frontend's :class:`~learner.serving.servicer.LearnerServicer` counts what it refuses
and ends (streams rejected, timed out, invalid) on its :class:`FrontendStats`, whose
counters are its row of a small shared-memory block. The model process reads every row
(:class:`FrontendCounters`) and adds them to its own record under the same names, so
``metrics.jsonl`` and TensorBoard read as with one process; a dead frontend's counts are
kept (:meth:`FrontendCounters.retire`) before its restart counts from zero.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from learner.serving.admission import Admission, CountsSpec, SharedCounts
from learner.state.stats import LearnerStats
from seedrl.config import LearnerConfig
from seedrl.timing import process_rss_mb

COUNTERS = ("streams_rejected", "streams_timed_out", "streams_invalid")
"""What a frontend's servicer counts, by the names the learner's metrics give them."""


class _SharedCounter:
    """A counter attribute stored in its frontend's row of the shared block."""

    def __init__(self, column: int) -> None:
        self.column = column

    def __get__(self, stats: Any, owner: Any = None) -> int:
        return int(stats.shared_row[self.column])

    def __set__(self, stats: Any, value: int) -> None:
        stats.shared_row[self.column] = value


class FrontendStats(LearnerStats):
    """A frontend's stats: the servicer's stream counters live in ``row`` (this frontend's
    row of the block), written per stream event, so the model reads them as they move."""

    streams_rejected = _SharedCounter(0)
    streams_timed_out = _SharedCounter(1)
    streams_invalid = _SharedCounter(2)

    def __init__(self, row: np.ndarray, time_phases: bool = False) -> None:
        self.shared_row = row
        super().__init__(time_phases=time_phases)


class FrontendCounters:
    """The block: a row of :data:`COUNTERS` per frontend (created by the model process,
    attached by name in each frontend)."""

    def __init__(self, frontends: int, name: str | None = None) -> None:
        self.frontends = frontends
        self.owner = name is None
        if name is None:
            name = f"seedrl-fec-{os.getpid()}-{os.urandom(4).hex()}"
        size = 8 * frontends * len(COUNTERS)
        self.shm = shared_memory.SharedMemory(name=name, create=self.owner, size=size)
        buf = self.shm.buf
        assert buf is not None
        self.counts_HC = np.frombuffer(buf, np.int64, frontends * len(COUNTERS)).reshape(
            frontends, len(COUNTERS)
        )
        if self.owner:
            self.counts_HC[:] = 0
        self._retired_C = np.zeros(len(COUNTERS), np.int64)
        self._last: dict[str, float] = dict.fromkeys(COUNTERS, 0)

    @property
    def name(self) -> str:
        return self.shm.name

    def row(self, index: int) -> np.ndarray:
        return self.counts_HC[index]

    def retire(self, index: int) -> None:
        """A frontend died: keep its counts (its restart starts its row from zero)."""
        self._retired_C += self.counts_HC[index]
        self.counts_HC[index] = 0

    def sums(self) -> dict[str, float]:
        """Every frontend's counts, the dead ones' included (the last read once closed)."""
        if self.shm.buf is not None and hasattr(self, "counts_HC"):
            total_C = self._retired_C + self.counts_HC.sum(axis=0)
            self._last = {name: int(n) for name, n in zip(COUNTERS, total_C, strict=True)}
        return dict(self._last)

    def close(self) -> None:
        self.sums()
        del self.counts_HC
        self.shm.close()
        if self.owner:
            with contextlib.suppress(FileNotFoundError):
                self.shm.unlink()


def frontend_metrics(
    counters: FrontendCounters, pids: Callable[[], list[int | None]]
) -> Callable[[], dict[str, float]]:
    """The model's metrics source: the frontends' counters summed, and each frontend's
    resident set size as ``serving_rss_mb/<i>`` (0 while it is down)."""

    def read() -> dict[str, float]:
        record = counters.sums()
        for index, pid in enumerate(pids()):
            record[f"serving_rss_mb/{index}"] = process_rss_mb(pid) if pid else 0.0
        return record

    return read


@dataclass(frozen=True)
class StreamBlocks:
    """What a frontend attaches to beside the slot table: the shared admission counts and
    the counters block (their names, pickled with the spawn)."""

    admission: CountsSpec
    counters: str
    frontends: int

    def open(self, config: LearnerConfig, index: int) -> tuple[Admission, FrontendStats, Any]:
        """Frontend ``index``'s admission, its stats, and what must stay mapped with them."""
        counts = SharedCounts(self.admission, holder=index)
        counters = FrontendCounters(self.frontends, self.counters)
        stats = FrontendStats(counters.row(index), time_phases=config.time_phases)
        return Admission(config, counts), stats, (counts, counters)
