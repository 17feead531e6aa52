"""Dynamic batcher: many actors' pending frames -> one forward pass.

A batch closes when ``max_frames`` frames are pending, when a share ``quorum`` of the
open streams (``--inference-quorum``, whose default is below 1: not all of them) has a
request pending, or when ``timeout_s`` has passed since the first pending request,
whichever comes first. Waiting for streams that are already pending is pure latency; a
quorum below 1 also stops a few stragglers among many streams from holding every batch
to the timeout. Nothing waits without a bound, so a stalled or dead actor never stalls
the others.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)


QUORUM_NONE = 1 << 62
"""The quorum while no stream is open: never reached (only size or deadline close a batch)."""


class BatcherClosed(Exception):
    """The batcher was stopped: no more frames are served."""


class PendingRequest:
    """One stream's frame of ``num_frames`` envs, waiting for its share of a batch."""

    __slots__ = ("future", "num_frames", "payload")

    def __init__(self, payload: Any, num_frames: int, future: asyncio.Future[Any]) -> None:
        self.payload = payload
        self.num_frames = num_frames
        self.future = future


ProcessFn = Callable[[list[PendingRequest]], Awaitable[None]]


class DynamicBatcher:
    """Collects requests on the event loop and hands closed batches to ``process``.

    ``process`` must resolve every request's future (result or exception).
    """

    def __init__(
        self, process: ProcessFn, max_frames: int, timeout_s: float, quorum: float = 1.0
    ) -> None:
        if not 0.0 < quorum <= 1.0:
            raise ValueError(f"quorum must be in (0, 1], got {quorum}")
        self._process = process
        self.max_frames = max_frames
        self.timeout_s = timeout_s
        self.quorum = quorum
        self._open_streams = 0
        self._quorum_requests = QUORUM_NONE
        self._pending: list[PendingRequest] = []
        self._pending_frames = 0
        self._wakeup = asyncio.Event()
        self._ready = asyncio.Event()
        self._closed = False
        self._first_pending_at = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        # counters for metrics
        self.batches = 0
        self.frames = 0

    @property
    def open_streams(self) -> int:
        return self._open_streams

    @open_streams.setter
    def open_streams(self, count: int) -> None:
        # The quorum in requests is worked out here, once per stream that comes or goes,
        # not on every submit.
        self._open_streams = count
        self._quorum_requests = math.ceil(self.quorum * count - 1e-9) if count > 0 else QUORUM_NONE

    def _batch_ready(self) -> bool:
        return (
            self._pending_frames >= self.max_frames or len(self._pending) >= self._quorum_requests
        )

    def set_open_streams(self, count: int) -> None:
        """Track how many streams can still submit; a closed stream may complete a batch."""
        self.open_streams = count
        if self._pending and self._batch_ready():
            self._ready.set()

    async def submit(self, payload: Any, num_frames: int) -> Any:
        """Queue one request and wait for its result."""
        if self._closed:
            raise BatcherClosed
        # The loop is looked up once: asyncio.get_running_loop() makes a getpid() system
        # call on every call in Python 3.11, and this runs once per frame.
        loop = self._loop or self._bind_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if not self._pending:
            self._first_pending_at = loop.time()
        self._pending.append(PendingRequest(payload, num_frames, future))
        self._pending_frames += num_frames
        self._wakeup.set()
        if self._batch_ready():
            self._ready.set()
        return await future

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        self._loop = asyncio.get_running_loop()
        return self._loop

    async def run(self) -> None:
        """The batching loop; runs until :meth:`close`."""
        loop = self._bind_loop()
        while not self._closed:
            await self._wakeup.wait()
            if self._closed:
                break
            remaining = self._first_pending_at + self.timeout_s - loop.time()
            if remaining > 0 and not self._batch_ready():
                # One timer handle per batch; asyncio.wait_for would cost a task each time.
                self._ready.clear()
                deadline = loop.call_later(remaining, self._ready.set)
                await self._ready.wait()
                deadline.cancel()
            batch = self._take()
            if not batch:
                continue
            self.batches += 1
            self.frames += sum(r.num_frames for r in batch)
            try:
                await self._process(batch)
            except Exception as exc:  # keep serving; fail only this batch's requests
                log.exception("inference batch failed")
                for request in batch:
                    if not request.future.done():
                        request.future.set_exception(exc)
        self._fail_pending()

    def _take(self) -> list[PendingRequest]:
        batch, self._pending = self._pending, []
        self._pending_frames = 0
        self._wakeup.clear()
        self._ready.clear()
        # Requests whose stream went away meanwhile are dropped here.
        return [r for r in batch if not r.future.cancelled()]

    def _fail_pending(self) -> None:
        for request in self._take():
            if not request.future.done():
                request.future.set_exception(BatcherClosed())

    def close(self) -> None:
        """Stop batching; pending and future submits raise :class:`BatcherClosed`."""
        self._closed = True
        self._wakeup.set()
        self._ready.set()
        self._fail_pending()
