"""One bidirectional gRPC stream, driven entirely by the thread that uses it.

An actor makes one round trip per env step, so the cost of one message is the cost that
matters. Both of grpcio's public streaming clients hand every message to another thread.
``grpc.aio`` uses a completion-queue poller thread that wakes the event loop through a
socket. The sync API uses the channel's spin thread plus a thread that drains the request
iterator. Every round trip then costs several context switches across those threads,
which with one env per message is most of an actor's CPU.

``LockstepStream`` starts each operation on the calling thread. It then waits on the
call's own completion queue, where gRPC core, with EventEngine off
(``seedrl.grpc_defaults``), also does the socket I/O. That is one thread and one sleep
per round trip, so an actor spends less CPU per frame than with either public client
(measured in docs/performance.md).

grpcio's experimental single-threaded unary-stream calls work the same way
(``grpc.experimental.ChannelOptions.SingleThreadedUnaryStream``). grpcio offers nothing
like it for bidirectional calls, so this module builds it on the same layer:
``grpc._cython.cygrpc``'s segregated calls. That layer is not public API. Each behaviour
the actor relies on has a test (tests/test_stream.py), so a grpcio release that changes it
fails our CI rather than our users. Should it still be missing at run time,
``open_stream`` falls back to ``ThreadedStream`` on the public sync API, with a warning.
"""

from __future__ import annotations

import functools
import logging
import queue
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import grpc

log = logging.getLogger(__name__)

try:
    from grpc._cython import cygrpc

    _SEND_MESSAGE = cygrpc.OperationType.send_message
    _SEND_CLOSE = cygrpc.OperationType.send_close_from_client
    _RECEIVE_MESSAGE = cygrpc.OperationType.receive_message
    _RECEIVE_STATUS = cygrpc.OperationType.receive_status_on_client
    _CYGRPC_ERROR: str | None = None
except (ImportError, AttributeError) as exc:  # a grpcio whose private layer moved
    _CYGRPC_ERROR = f"{type(exc).__name__}: {exc}"

_STATUS_BY_VALUE = {status.value[0]: status for status in grpc.StatusCode}
_NO_FLAGS = 0


class StreamError(grpc.RpcError):
    """The stream ended with a status other than OK (code and details, as grpc's own errors)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class ActorStream(Protocol):
    """What the actor needs of its stream; both implementations below derive from it."""

    def write(self, data: bytes) -> bool: ...
    def read(self) -> bytes | None: ...
    def done_writing(self) -> None: ...
    def status(self) -> tuple[grpc.StatusCode, str]: ...
    def cancel(self) -> None: ...
    def close(self) -> None: ...

    def exchange(self, data: bytes) -> bytes | None:
        """Write one message and read the reply; None once the stream has ended."""
        return self.read() if self.write(data) else None

    def raise_for_status(self) -> None:
        """Raise ``StreamError`` unless the stream ended with OK."""
        code, details = self.status()
        if code is not grpc.StatusCode.OK:
            raise StreamError(code, details)


class LockstepStream(ActorStream):
    """A client bidirectional stream for strict request/reply alternation on one thread.

    ``write`` starts sending a message and returns without waiting for it to go out.
    ``read`` waits for the next message. Completions that arrive on the way, such as the
    previous write's, are taken as they come. ``cancel`` may be called from another
    thread; it ends a ``read`` blocked there. A signal handler that raises, on the main
    thread, ends the wait too: gRPC then frees the call, and the stream is over.
    """

    def __init__(
        self, channel: grpc.Channel, method: str, metadata: Sequence[tuple[str, str]] = ()
    ) -> None:
        metadata = tuple(metadata)
        opening = (
            ((cygrpc.SendInitialMetadataOperation(metadata, _NO_FLAGS),), None),
            ((cygrpc.ReceiveInitialMetadataOperation(_NO_FLAGS),), None),
            ((cygrpc.ReceiveStatusOnClientOperation(_NO_FLAGS),), None),
        )
        core_channel = channel._channel  # grpc._channel.Channel's cygrpc.Channel
        self._call = core_channel.segregated_call(
            cygrpc.PropagationConstants.GRPC_PROPAGATE_DEFAULTS,
            method.encode(),
            None,  # host
            None,  # deadline: a stream lives as long as training
            metadata,
            None,  # call credentials: the channel's are enough
            opening,
            None,  # tracing context
            None,  # registered call handle
        )
        self._pending = len(opening)
        """Operation batches started and not completed. When it reaches 0 gRPC frees the
        call and its queue, so waiting on the queue again would be an error."""
        self._sending = False
        self._receiving = False
        self._message: bytes | None = None
        self._status: tuple[grpc.StatusCode, str] | None = None

    def write(self, data: bytes) -> bool:
        """Start sending one serialized message; False if the stream has already ended.

        Waits only for the previous write to complete: gRPC allows one at a time.
        """
        while self._sending:
            self._next_event()
        if not self._start((cygrpc.SendMessageOperation(data, _NO_FLAGS),)):
            return False
        self._sending = True
        return True

    def read(self) -> bytes | None:
        """The next message, or None once the stream has ended (then see ``status``)."""
        if not self._start((cygrpc.ReceiveMessageOperation(_NO_FLAGS),)):
            return None
        self._receiving = True
        return self._received()

    def exchange(self, data: bytes) -> bytes | None:
        """Send one message and wait for the reply: one operation batch, one wake-up.

        The same as ``write`` then ``read``, for half of gRPC's per-message work: the
        send and the receive complete together, so the thread waits on the queue once.
        None once the stream has ended (then see ``status``).
        """
        while self._sending:
            self._next_event()
        operations = (
            cygrpc.SendMessageOperation(data, _NO_FLAGS),
            cygrpc.ReceiveMessageOperation(_NO_FLAGS),
        )
        if not self._start(operations):
            return None
        self._sending = self._receiving = True
        return self._received()

    def done_writing(self) -> None:
        """Half-close: tell the server no more messages come from this side."""
        while self._sending:
            self._next_event()
        if self._start((cygrpc.SendCloseFromClientOperation(_NO_FLAGS),)):
            self._sending = True

    def status(self) -> tuple[grpc.StatusCode, str]:
        """The status the stream ended with, waiting for it if need be.

        A stream whose wait was cut short by a signal has no status: it reads as CANCELLED.
        """
        while self._status is None and self._pending:
            self._next_event()
        return self._status or (grpc.StatusCode.CANCELLED, "stream abandoned")

    def cancel(self) -> None:
        """End the stream now (safe from another thread; a no-op once it has ended)."""
        self._call.cancel(cygrpc.StatusCode.cancelled, "Cancelled by the actor")

    def close(self) -> None:
        """Cancel if still open, and take the remaining completions so gRPC frees the call.

        After a cancel every pending operation completes at once, so this does not wait
        on the network.
        """
        if self._pending:
            self.cancel()
        while self._pending:
            self._next_event()

    def _received(self) -> bytes | None:
        """Wait for the receive just started; its message, or None if the stream ended."""
        while self._receiving:
            self._next_event()
        message, self._message = self._message, None
        return message

    def _start(self, operations: tuple[cygrpc.Operation, ...]) -> bool:
        if not self._pending or not self._call.operate(operations, None):
            return False  # the call has completed: nothing more can start
        self._pending += 1
        return True

    def _next_event(self) -> None:
        try:
            event = self._call.next_event()
        except BaseException:
            # A signal handler raised while we waited. gRPC has cancelled and freed the
            # call, and every operation with it.
            self._pending = 0
            self._sending = self._receiving = False
            raise
        self._pending -= 1
        for operation in event.batch_operations:
            kind = operation.type()
            if kind == _RECEIVE_MESSAGE:
                self._receiving = False
                self._message = operation.message()
            elif kind in (_SEND_MESSAGE, _SEND_CLOSE):
                self._sending = False
            elif kind == _RECEIVE_STATUS:
                details = operation.details()
                if isinstance(details, bytes):
                    details = details.decode("utf-8", "replace")
                code = _STATUS_BY_VALUE.get(operation.code(), grpc.StatusCode.UNKNOWN)
                self._status = (code, details)


_END_OF_REQUESTS = object()


class ThreadedStream(ActorStream):
    """The same interface on grpcio's public sync API, for a grpcio without segregated calls.

    grpcio drains the request iterator on a thread of its own and delivers replies through
    its channel thread, so a round trip costs a few context switches more than
    ``LockstepStream``; it is the fallback, not the default.
    """

    def __init__(
        self, channel: grpc.Channel, method: str, metadata: Sequence[tuple[str, str]] = ()
    ) -> None:
        self._requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # No serializers: requests and replies are the bytes the caller made and parses.
        open_call = channel.stream_stream(method)
        requests: Iterator[bytes] = iter(self._requests.get, _END_OF_REQUESTS)
        self._call: Any = open_call(requests, metadata=tuple(metadata))
        self._writing = True

    def write(self, data: bytes) -> bool:
        """Queue one serialized message; False if the stream has already ended."""
        if not self._writing or self._call.done():
            return False
        self._requests.put(data)
        return True

    def read(self) -> bytes | None:
        """The next message, or None once the stream has ended (then see ``status``)."""
        try:
            return next(self._call)
        except (StopIteration, grpc.RpcError):
            return None

    def done_writing(self) -> None:
        """Half-close: tell the server no more messages come from this side."""
        if self._writing:
            self._writing = False
            self._requests.put(_END_OF_REQUESTS)

    def status(self) -> tuple[grpc.StatusCode, str]:
        """The status the stream ended with, waiting for it if need be."""
        return self._call.code(), self._call.details() or ""

    def cancel(self) -> None:
        """End the stream now (safe from another thread)."""
        self._call.cancel()

    def close(self) -> None:
        """Cancel if still open and end the request iterator, so grpcio's thread exits."""
        if not self._call.done():
            self._call.cancel()
        self.done_writing()


def open_stream(
    channel: grpc.Channel, method: str, metadata: Sequence[tuple[str, str]] = ()
) -> ActorStream:
    """A ``LockstepStream`` where grpcio's Cython layer allows, else a ``ThreadedStream``."""
    core_channel = getattr(channel, "_channel", None)
    if _CYGRPC_ERROR is None and hasattr(core_channel, "segregated_call"):
        return LockstepStream(channel, method, metadata)
    _warn_fallback_once(_CYGRPC_ERROR or "the channel has no segregated calls")
    return ThreadedStream(channel, method, metadata)


@functools.cache
def _warn_fallback_once(reason: str) -> None:
    log.warning(
        "grpcio %s lacks the single-threaded stream seedrl uses (%s): actors stream "
        "through grpcio's public API, a little slower per message",
        grpc.__version__,
        reason,
    )
