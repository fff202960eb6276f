"""gRPC rules both planes' servers share: request messages that are missing or malformed.

`RequestChecks` answers INVALID_ARGUMENT before a servicer runs when a request's bytes do
not decode as the method's message (grpc itself answers UNKNOWN, names its exception
class and logs an ERROR traceback per call), or when a unary-request call ends its
side without sending a message (grpc's unary handlers then return without a status and
the client waits for its deadline). Each refusal is logged once, at debug level.

It serves every unary-request method through a stream-request handler that takes the
first message: the wire is the same, and only a stream handler sees the request side
end. Put it after the auth interceptor, so an unauthenticated call is refused as such.

Imports only grpc: the data plane may not import rimuru.controlplane.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator

import grpc

log = logging.getLogger("rimuru.rpc")

_UNDECODABLE = object()  # what the checked deserializer returns for bytes it cannot read


class RequestChecks(grpc.aio.ServerInterceptor):
    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler  # unknown method (grpc answers UNIMPLEMENTED), or raw bytes
        return _checked(handler, handler_call_details.method)


def _checked(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    deserialize = handler.request_deserializer
    descriptor = getattr(getattr(deserialize, "__self__", None), "DESCRIPTOR", None)
    message = descriptor.full_name if descriptor is not None else "request message"

    def decode(raw: bytes):
        try:
            return deserialize(raw)
        except Exception:  # DecodeError, or another parser complaint: never a server bug
            return _UNDECODABLE

    async def requests(request_iterator, context) -> AsyncIterator:
        async for request in request_iterator:
            if request is _UNDECODABLE:
                await _refuse(context, method, f"malformed request: not a serialized {message}")
            yield request

    async def first_request(request_iterator, context):
        request = await anext(aiter(request_iterator), None)
        if request is None:
            await _refuse(context, method, f"no request message: send one {message}")
        if request is _UNDECODABLE:
            await _refuse(context, method, f"malformed request: not a serialized {message}")
        return request

    if handler.request_streaming:
        behaviour = handler.stream_stream or handler.stream_unary

        async def argument(request_iterator, context):
            return requests(request_iterator, context)

    else:
        behaviour = handler.unary_stream or handler.unary_unary
        argument = first_request

    # A streaming behaviour may be an async generator or a coroutine that calls
    # context.write (the health service's Watch): the wrapper must be the same kind.
    if inspect.isasyncgenfunction(behaviour):

        async def checked(request_iterator, context):
            request = await argument(request_iterator, context)
            async for response in behaviour(request, context):
                yield response

    else:

        async def checked(request_iterator, context):
            return await behaviour(await argument(request_iterator, context), context)

    make = (
        grpc.stream_stream_rpc_method_handler
        if handler.response_streaming
        else grpc.stream_unary_rpc_method_handler
    )
    return make(
        checked, request_deserializer=decode, response_serializer=handler.response_serializer
    )


async def _refuse(context, method: str, detail: str) -> None:
    log.debug("%s refused: %s", method, detail)
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, detail)
