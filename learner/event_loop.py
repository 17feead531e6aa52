"""The event loop the learner (and the echo server) serve on: uvloop where installed.

Every frame an actor sends costs the serving thread a few trips through the event loop:
gRPC's completion-queue poller wakes it through a socket, the stream's coroutine resumes
to read, waits on the batch's future, resumes to write. uvloop runs that machinery in
Cython on libuv instead of in ``asyncio``'s Python, which the learner feels per frame
(64 single-env actors on 2 cores: the serving thread's CPU per frame 81-82 -> 69 µs,
frames/s +5 %). It is a learner-side dependency only (actors do not use asyncio), and
not on Windows, so ``auto`` falls back to asyncio's own loop where it is missing.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

EVENT_LOOPS = ("auto", "uvloop", "asyncio")
T = TypeVar("T")


def uvloop_available() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def loop_factory(choice: str = "auto") -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory ``asyncio.Runner`` should build its loop with (None: asyncio's default)."""
    if choice not in EVENT_LOOPS:
        raise ValueError(f"event loop must be one of {', '.join(EVENT_LOOPS)}, got {choice!r}")
    if choice == "asyncio" or (choice == "auto" and not uvloop_available()):
        return None
    try:
        import uvloop
    except ImportError as exc:
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
