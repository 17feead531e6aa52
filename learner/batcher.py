"""Dynamic batcher: many actors' pending frames -> one forward pass.

A batch closes when ``max_frames`` frames are pending, when every open stream has a
request pending (nobody else can add to it, so waiting is pure latency), or when
``timeout_s`` has passed since the first pending request, whichever comes first.
Nothing waits without a bound, so a stalled or dead actor never stalls the others.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)


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

    def __init__(self, process: ProcessFn, max_frames: int, timeout_s: float) -> None:
        self._process = process
        self.max_frames = max_frames
        self.timeout_s = timeout_s
        self.open_streams = 0
        self._pending: list[PendingRequest] = []
        self._pending_frames = 0
        self._wakeup = asyncio.Event()
        self._ready = asyncio.Event()
        self._closed = False
        self._first_pending_at = 0.0
        # counters for metrics
        self.batches = 0
        self.frames = 0

    def _batch_ready(self) -> bool:
        if self._pending_frames >= self.max_frames:
            return True
        return 0 < self.open_streams <= len(self._pending)

    def set_open_streams(self, count: int) -> None:
        """Track how many streams can still submit; a closed stream may complete a batch."""
        self.open_streams = count
        if self._pending and self._batch_ready():
            self._ready.set()

    async def submit(self, payload: Any, num_frames: int) -> Any:
        """Queue one request and wait for its result."""
        if self._closed:
            raise BatcherClosed
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if not self._pending:
            self._first_pending_at = loop.time()
        self._pending.append(PendingRequest(payload, num_frames, future))
        self._pending_frames += num_frames
        self._wakeup.set()
        if self._batch_ready():
            self._ready.set()
        return await future

    async def run(self) -> None:
        """The batching loop; runs until :meth:`close`."""
        loop = asyncio.get_running_loop()
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
