"""The event loop the learner (and the echo server) serve on: uvloop where installed.

Every frame an actor sends costs the serving thread a few trips through the event loop:
gRPC's completion-queue poller wakes it through a socket, the stream's coroutine resumes
to read, waits on the batch's future, resumes to write. uvloop runs that machinery in
Cython on libuv instead of in ``asyncio``'s Python, which the learner feels per frame
(64 single-env actors on 2 cores: the serving thread's CPU per frame 78-84 -> 71-76 µs).
It is a learner-side dependency only (actors do not use asyncio), and not on Windows,
so ``auto`` falls back to asyncio's own loop where it is missing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from seedrl.config import EVENT_LOOPS

T = TypeVar("T")


def loop_factory(choice: str = "auto") -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory ``asyncio.Runner`` should build its loop with (None: asyncio's default)."""
    if choice not in EVENT_LOOPS:
        raise ValueError(f"event loop must be one of {', '.join(EVENT_LOOPS)}, got {choice!r}")
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError as exc:
        if choice == "auto":
            return None
        raise RuntimeError(
            "--event-loop uvloop needs the uvloop package (pip install uvloop; "
            "not available on Windows); --event-loop auto falls back to asyncio's loop"
        ) from exc
    return uvloop.new_event_loop


def running_loop_name() -> str:
    """``uvloop`` or ``asyncio``: which loop this coroutine runs on (for the startup line)."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.startswith("uvloop") else "asyncio"


def run(coroutine: Coroutine[Any, Any, T], choice: str = "auto") -> T:
    """``asyncio.run`` on the chosen loop (signal handling and cleanup as asyncio.run's)."""
    with asyncio.Runner(loop_factory=loop_factory(choice)) as runner:
        return runner.run(coroutine)
