"""Domain errors <-> gRPC status codes: the one place where the mapping lives.

Servers wrap servicer methods with `maps_errors`; the client turns a failed call back
into the domain error with `error_from_rpc`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import grpc

from rimuru.controlplane import errors
from rimuru.policy import InvalidPolicy

_CODES: dict[type[Exception], grpc.StatusCode] = {
    InvalidPolicy: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.VersionConflict: grpc.StatusCode.ABORTED,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
}


def code_for(exc: errors.ControlPlaneError | InvalidPolicy) -> grpc.StatusCode:
    for cls in type(exc).__mro__:
        if cls in _CODES:
            return _CODES[cls]
    return grpc.StatusCode.UNKNOWN


def error_from_rpc(exc: grpc.RpcError) -> errors.ControlPlaneError:
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    message = (exc.details() if hasattr(exc, "details") else None) or str(exc)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        field, sep, rest = message.partition(": ")
        return errors.InvalidArgument(field, rest) if sep else errors.InvalidArgument("", message)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return errors.Unavailable(f"deadline exceeded: {message}")
    for cls, cls_code in _CODES.items():
        if code == cls_code:
            return cls(message)
    return errors.ControlPlaneError(f"{code.name}: {message}")


def maps_errors(method: Callable) -> Callable:
    """Abort the call with the mapped status when a servicer method raises a domain error."""
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def stream_wrapper(self, request, context):
            try:
                async for item in method(self, request, context):
                    yield item
            except errors.DOMAIN_ERRORS as exc:
                await context.abort(code_for(exc), str(exc))

        return stream_wrapper

    @functools.wraps(method)
    async def unary_wrapper(self, request, context):
        try:
            return await method(self, request, context)
        except errors.DOMAIN_ERRORS as exc:
            await context.abort(code_for(exc), str(exc))

    return unary_wrapper
