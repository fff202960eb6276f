"""Domain errors of the data plane and their gRPC status codes: the one place they map.

Servicer methods raise these (or let the engine thread hand one back); `grpc_errors`
turns each into `context.abort(code, message)`. Anything else is a bug and surfaces as
INTERNAL through grpc itself.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import grpc


class ServeError(Exception):
    """Base of every error a data-plane client is told about."""


class InvalidArgument(ServeError, ValueError):
    """A request field is wrong; `field` names it as the proto spells it (dotted path)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class QueueFull(ServeError):
    """The bounded waiting queue is full: retry later or on another replica."""


class Unavailable(ServeError):
    """Not serving right now (loading, or draining for shutdown): retry elsewhere."""


class FailedPrecondition(ServeError):
    """The request cannot work on this server as configured (e.g. text without tokenizer)."""


class EngineFailed(ServeError):
    """The engine thread stopped on an unexpected error; the server is unhealthy."""


class RequestFailed(ServeError):
    """The engine could not finish this one request (its logits were not finite, say);
    the others run on."""


_CODES: dict[type[ServeError], grpc.StatusCode] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    QueueFull: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Unavailable: grpc.StatusCode.UNAVAILABLE,
    FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    EngineFailed: grpc.StatusCode.INTERNAL,
    RequestFailed: grpc.StatusCode.INTERNAL,
}


def status_code(exc: ServeError) -> grpc.StatusCode:
    for cls in type(exc).__mro__:
        if cls in _CODES:
            return _CODES[cls]
    return grpc.StatusCode.UNKNOWN


def grpc_errors(method: Callable) -> Callable:
    """Abort the call with the mapped status when a servicer method raises a ServeError."""
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def streaming(self, request, context):
            try:
                async for item in method(self, request, context):
                    yield item
            except ServeError as exc:
                await context.abort(status_code(exc), str(exc))

        return streaming

    @functools.wraps(method)
    async def unary(self, request, context):
        try:
            return await method(self, request, context)
        except ServeError as exc:
            await context.abort(status_code(exc), str(exc))

    return unary
