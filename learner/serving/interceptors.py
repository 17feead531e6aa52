"""Server interceptors every call passes: the shared-token check and the decode guard.

Both rewrite a method's handler into one of the same streaming kind
(:func:`same_kind_handler`): the token check into one that fails UNAUTHENTICATED, the
guard into one whose tolerant parse lets the handler answer INVALID_ARGUMENT.
"""

from __future__ import annotations

import hmac
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from seedrl.transport import AUTH_METADATA_KEY

HEALTH_PREFIX = "/grpc.health.v1.Health/"

Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]]


def same_kind_handler(
    handler: grpc.RpcMethodHandler,
    behavior: Callable[[Callable[..., Any] | None, bool], Callable[..., Any]],
    request_deserializer: Callable[[bytes], Any] | None,
) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s streaming kind whose behaviour is
    ``behavior(original behaviour, request is a stream)``."""
    kw = {
        "request_deserializer": request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(behavior(handler.stream_stream, True), **kw)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(behavior(handler.stream_unary, True), **kw)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(behavior(handler.unary_stream, False), **kw)
    return grpc.unary_unary_rpc_method_handler(behavior(handler.unary_unary, False), **kw)


class HandlerRewriter(grpc.aio.ServerInterceptor):
    """An interceptor that swaps the handler of every method that has one for
    :meth:`rewrite`'s (the one hook both interceptors here fill in)."""

    async def intercept_service(self, continuation: Continuation, details: Any) -> Any:
        handler = await continuation(details)
        return handler if handler is None else self.rewrite(handler, details)

    def rewrite(
        self, handler: grpc.RpcMethodHandler, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        raise NotImplementedError


class TokenAuthInterceptor(HandlerRewriter):
    """Every call but health checks must carry ``authorization: Bearer <token>``."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def rewrite(
        self, handler: grpc.RpcMethodHandler, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        if details.method.startswith(HEALTH_PREFIX):
            return handler
        supplied = ""
        for key, value in details.invocation_metadata or ():
            if key == AUTH_METADATA_KEY:
                supplied = value if isinstance(value, str) else value.decode(errors="replace")
        if hmac.compare_digest(supplied.encode(), self._expected):
            return handler
        return _deny_handler(handler)


def _deny_handler(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same streaming kind that fails with UNAUTHENTICATED."""

    async def deny(request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong auth token")

    async def deny_stream(request: Any, context: Any) -> AsyncIterator[Any]:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong auth token")
        yield None  # pragma: no cover - never reached, makes this an async generator

    kw = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny_stream, **kw)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(deny, **kw)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(deny_stream, **kw)
    return grpc.unary_unary_rpc_method_handler(deny, **kw)


class Undecodable:
    """Stands in for a request whose bytes did not parse, so the handler can reject it."""

    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error

    def describe(self, method: str) -> str:
        return f"{method}: request is not a valid protobuf message ({self.error})"


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    return None if deserializer is None else undecodable_on_error(deserializer)


def undecodable_on_error(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """``deserializer`` that returns :class:`Undecodable` instead of raising."""

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:
            return Undecodable(f"{type(exc).__name__}: {exc}")

    return deserialize


class DecodeGuardInterceptor(HandlerRewriter):
    """Bytes that do not parse end the call with INVALID_ARGUMENT, quietly.

    Without this, grpc answers UNKNOWN and logs a traceback per bad message, so any
    client could flood the learner's log. Applies to every service on the server;
    methods in ``checks_itself`` only get the tolerant deserializer and must reject
    :class:`Undecodable` requests themselves (the hot ``Act`` stream takes raw bytes
    and parses them itself, to save a wrapper and a parse per message).
    """

    def __init__(self, checks_itself: frozenset[str] = frozenset()) -> None:
        self._checks_itself = checks_itself

    def rewrite(
        self, handler: grpc.RpcMethodHandler, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        checks_itself = details.method in self._checks_itself
        return _guard_handler(handler, details.method, wrap_behavior=not checks_itself)


def _guard_handler(
    handler: grpc.RpcMethodHandler, method: str, wrap_behavior: bool
) -> grpc.RpcMethodHandler:
    async def reject(request: Any, context: Any) -> None:
        if isinstance(request, Undecodable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.describe(method))

    async def checked(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        async for request in requests:
            await reject(request, context)
            yield request

    def wrap(behavior: Callable[..., Any], streaming_request: bool) -> Callable[..., Any]:
        if not wrap_behavior:
            return behavior
        if inspect.isasyncgenfunction(behavior):

            async def generate(request: Any, context: Any) -> AsyncIterator[Any]:
                if streaming_request:
                    request = checked(request, context)
                else:
                    await reject(request, context)
                async for response in behavior(request, context):
                    yield response

            return generate

        async def call(request: Any, context: Any) -> Any:
            if streaming_request:
                request = checked(request, context)
            else:
                await reject(request, context)
            result = behavior(request, context)
            return await result if inspect.isawaitable(result) else result

        return call

    def behavior(original: Callable[..., Any] | None, streaming_request: bool) -> Any:
        assert original is not None
        return wrap(original, streaming_request)

    return same_kind_handler(handler, behavior, _tolerant(handler.request_deserializer))
