"""``actors.stream``: the actor's bidirectional stream.

``LockstepStream`` is built on grpcio's Cython layer, which is not public API, so every
behaviour the actor relies on is checked here against a real server: lockstep round trips
on the calling thread alone, the server's status (OK or an error with its details), an
unreachable server, a cancel from another thread, a signal during a wait, and the same
stop paths in real actor processes whose learner hangs. ``ThreadedStream``, the fallback
on grpcio's public API, must behave the same way.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from actors.stream import (
    LockstepStream,
    StreamError,
    ThreadedStream,
    _warn_fallback_once,
    open_stream,
)
from tests.support import free_port, read_records, running, wait_until

METHOD = "/test.Lockstep/Talk"
StreamClass = type[LockstepStream] | type[ThreadedStream]
STREAMS: list[StreamClass] = [LockstepStream, ThreadedStream]
Handler = Callable[[Iterator[bytes], Any], Iterator[bytes]]


@contextlib.contextmanager
def raw_server(handler: Handler) -> Iterator[str]:
    """A sync gRPC server on a free loopback port whose one stream method speaks raw bytes."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    method = grpc.stream_stream_rpc_method_handler(handler)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("test.Lockstep", {"Talk": method}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None).wait(5)


def client_threads() -> set[threading.Thread]:
    """This process's Python threads, less the test server's request workers."""
    return {t for t in threading.enumerate() if not t.name.startswith("ThreadPoolExecutor")}


def replying(requests: Iterator[bytes], context: Any) -> Iterator[bytes]:
    for request in requests:
        yield b"re:" + request


@pytest.mark.parametrize("stream_class", STREAMS)
def test_round_trips_end_with_ok(stream_class: StreamClass) -> None:
    """Round trips as write then read, and as one ``exchange`` (the actor's hot path),
    mixed on one stream."""
    with raw_server(replying) as target, grpc.insecure_channel(target) as channel:
        threads_before = client_threads()
        stream = stream_class(channel, METHOD, (("x-trace", "1"),))
        for i in range(400):
            frame = f"frame {i}".encode()
            if i % 2:
                assert stream.exchange(frame) == b"re:" + frame
            else:
                assert stream.write(frame)
                assert stream.read() == b"re:" + frame
        if stream_class is LockstepStream:
            # No helper thread: grpcio's own streaming clients start one per channel or call.
            assert client_threads() == threads_before
        stream.done_writing()
        assert stream.read() is None
        assert stream.status() == (grpc.StatusCode.OK, "")
        stream.raise_for_status()
        stream.close()
        assert not stream.write(b"after the end")


@pytest.mark.parametrize("stream_class", STREAMS)
def test_exchange_gets_the_last_reply_of_a_stream_the_server_ends(
    stream_class: StreamClass,
) -> None:
    """As the learner's Shutdown: the server answers a frame and ends the stream with OK.
    The reply must arrive even though the send of the same batch may find the stream over."""

    def answering_twice(requests: Iterator[bytes], context: Any) -> Iterator[bytes]:
        yield b"re:" + next(requests)
        yield b"bye:" + next(requests)

    with raw_server(answering_twice) as target, grpc.insecure_channel(target) as channel:
        stream = stream_class(channel, METHOD)
        assert stream.exchange(b"one") == b"re:one"
        assert stream.exchange(b"two") == b"bye:two"
        assert stream.exchange(b"three") is None
        assert stream.status() == (grpc.StatusCode.OK, "")
        stream.close()


@pytest.mark.parametrize("stream_class", STREAMS)
def test_an_error_status_is_raised_with_its_details(stream_class: StreamClass) -> None:
    def refusing(requests: Iterator[bytes], context: Any) -> Iterator[bytes]:
        next(requests)
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad frame: NaN")
        yield b""  # pragma: no cover  (abort raises)

    with raw_server(refusing) as target, grpc.insecure_channel(target) as channel:
        stream = stream_class(channel, METHOD)
        stream.write(b"frame")
        assert stream.read() is None
        with pytest.raises(StreamError) as caught:
            stream.raise_for_status()
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert caught.value.details() == "bad frame: NaN"
        assert isinstance(caught.value, grpc.RpcError)
        stream.close()


@pytest.mark.parametrize("stream_class", STREAMS)
def test_an_unreachable_server_ends_the_stream_unavailable(stream_class: StreamClass) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{free_port()}") as channel:
        stream = stream_class(channel, METHOD)
        stream.write(b"hello")
        assert stream.read() is None
        assert stream.status()[0] is grpc.StatusCode.UNAVAILABLE
        stream.close()


@contextlib.contextmanager
def silent_server() -> Iterator[str]:
    """A server that takes the stream and never answers (a hung learner)."""
    release = threading.Event()

    def silent(requests: Iterator[bytes], context: Any) -> Iterator[bytes]:
        next(requests)
        release.wait(30)
        return iter(())

    try:
        with raw_server(silent) as target:
            yield target
    finally:
        release.set()


@pytest.mark.parametrize("stream_class", STREAMS)
def test_cancel_from_another_thread_ends_a_blocked_read(stream_class: StreamClass) -> None:
    with silent_server() as target, grpc.insecure_channel(target) as channel:
        stream = stream_class(channel, METHOD)
        stream.write(b"frame")
        timer = threading.Timer(0.3, stream.cancel)
        timer.start()
        started = time.monotonic()
        assert stream.read() is None
        assert time.monotonic() - started < 10
        assert stream.status()[0] is grpc.StatusCode.CANCELLED
        stream.close()
        timer.join()


class Interrupted(Exception):
    pass


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="POSIX interval timers")
@pytest.mark.parametrize("stream_class", STREAMS)
def test_a_raising_signal_handler_ends_a_wait(stream_class: StreamClass) -> None:
    def interrupt(signum: int, frame: Any) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        with silent_server() as target, grpc.insecure_channel(target) as channel:
            stream = stream_class(channel, METHOD)
            stream.write(b"frame")
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            started = time.monotonic()
            with pytest.raises(Interrupted):
                stream.read()
            # Closing does not wait on the silent server (LockstepStream: gRPC has already
            # freed the call), and the stream is over.
            stream.close()
            assert time.monotonic() - started < 10
            assert stream.status()[0] is grpc.StatusCode.CANCELLED
            assert not stream.write(b"more")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class _PassThrough(grpc.StreamStreamClientInterceptor):
    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(details, requests)


def test_open_stream_is_lockstep_and_falls_back_to_the_public_api(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with raw_server(replying) as target, grpc.insecure_channel(target) as channel:
        stream = open_stream(channel, METHOD)
        assert isinstance(stream, LockstepStream)
        stream.close()
        # An intercepted channel has no core channel to make segregated calls on.
        intercepted = grpc.intercept_channel(channel, _PassThrough())
        _warn_fallback_once.cache_clear()  # it warns once per process and reason
        with caplog.at_level(logging.WARNING, logger="actors.stream"):
            fallback = open_stream(intercepted, METHOD)
        assert isinstance(fallback, ThreadedStream)
        assert "public API" in caplog.text
        assert fallback.write(b"frame")
        assert fallback.read() == b"re:frame"
        fallback.done_writing()
        assert fallback.read() is None
        fallback.raise_for_status()
        fallback.close()


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="POSIX job control")
@pytest.mark.parametrize("groups", [1, 2])
def test_an_actor_whose_learner_hangs_stops_on_sigterm(tmp_path: Path, groups: int) -> None:
    """SIGSTOP the echo learner mid-stream: the actor's read would never return by itself."""
    port = free_port()
    echo = [
        sys.executable, "-m", "benchmarks.echo", "--port", str(port), "--logdir", str(tmp_path),
        "--log-interval-s", "0.2", "--no-local-socket",
    ]  # fmt: skip
    actor_cmd = [
        sys.executable, "-m", "actors", "actor", "--learner", f"127.0.0.1:{port}",
        "--envs-per-actor", "2", "--env-groups", str(groups),
    ]  # fmt: skip
    with running(echo) as learner:
        learner.wait_for("listening on", 60)
        with running(actor_cmd) as actor:
            wait_until(
                lambda: any(r["frames"] > 0 for r in read_records(tmp_path)), 60, what="frames"
            )
            learner.signal(signal.SIGSTOP)
            try:
                time.sleep(0.3)
                actor.signal(signal.SIGTERM)
                assert actor.wait(timeout=15) == 0, actor.output()
            finally:
                learner.signal(signal.SIGCONT)
