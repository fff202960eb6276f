"""gRPC rules both planes share: message size, bearer tokens, TLS files, bad requests.

`MAX_MESSAGE_BYTES` is the one message-size limit: every server and client of both planes
sets it as its send and receive limit (`message_size_options`), so a push the control
plane may send is one a data plane may receive; the control plane refuses a ranking or
policy whose push would not fit (INVALID_ARGUMENT) rather than store it.

`BearerTokens` refuses a guarded method without its `authorization: Bearer <token>`
header (UNAUTHENTICATED); more than one such header is refused whatever they hold.

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

import hmac
import inspect
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import grpc

log = logging.getLogger("rimuru.rpc")

# gRPC's default receive limit, now also every send limit: a larger ranking (thousands of
# layers x experts) would need every plane's limit raised together, through this constant.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


def message_size_options(max_bytes: int = MAX_MESSAGE_BYTES) -> tuple[tuple[str, int], ...]:
    """Channel or server options: send and receive at most max_bytes per message."""
    return (
        ("grpc.max_send_message_length", max_bytes),
        ("grpc.max_receive_message_length", max_bytes),
    )


@dataclass(frozen=True)
class TlsFiles:
    cert_chain: bytes  # PEM
    private_key: bytes  # PEM

    @classmethod
    def read(cls, cert_path: str, key_path: str) -> TlsFiles:
        try:
            with open(cert_path, "rb") as cert, open(key_path, "rb") as key:
                cert_chain, private_key = cert.read(), key.read()
        except OSError as exc:
            raise ValueError(f"cannot read the TLS certificate or key: {exc}") from exc
        # grpc accepts any bytes here and fails only when binding, as "cannot bind".
        if b"-----BEGIN CERTIFICATE-----" not in cert_chain:
            raise ValueError(f"{cert_path} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
        if b"PRIVATE KEY-----" not in private_key:
            raise ValueError(
                f"{key_path} holds no PEM private key (-----BEGIN ... PRIVATE KEY-----)"
            )
        return cls(cert_chain, private_key)

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials([(self.private_key, self.cert_chain)])


def read_token(path: str) -> str:
    """A bearer token file (a mounted Secret): its content without surrounding whitespace."""
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as exc:
        raise ValueError(f"cannot read the token file {path}: {exc}") from exc
    if not token:
        raise ValueError(f"the token file {path} is empty: put the bearer token in it")
    return token


def read_root_certificates(path: str, flag: str) -> bytes:
    """A PEM CA file a client trusts (`flag` names it in the error)."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise ValueError(f"cannot read {flag} {path}: {exc}") from exc


# Every server's options: without it grpc binds with SO_REUSEPORT, and a second server on a
# port in use starts as if alone, the kernel splitting connections between the two.
EXCLUSIVE_PORT = (("grpc.so_reuseport", 0),)


def bind(server: grpc.aio.Server, address: str, tls: TlsFiles | None, what: str) -> int:
    """Add a listening port (TLS when given); ValueError, naming `what`, when the address
    cannot be bound (grpc returns 0 or raises, by version)."""
    try:
        if tls is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, tls.server_credentials())
    except RuntimeError:
        port = 0
    if port == 0:
        raise ValueError(
            f"cannot bind {what} to {address}: the port is in use or the host is not one of "
            "this machine's addresses; pick another --port (0 = any free one) or --host"
        )
    return port


class BearerTokens(grpc.aio.ServerInterceptor):
    """Guarded methods need `authorization: Bearer <their token>`; other methods pass.

    hint: what the refusal tells the caller to do (which flag supplies the token)."""

    def __init__(self, tokens: Mapping[str, str], hint: str) -> None:
        if not all(tokens.values()):
            raise ValueError("tokens must be non-empty; pass no interceptor to leave calls open")
        self._expected = {method: f"Bearer {t}".encode() for method, t in tokens.items()}
        self._hint = hint

    async def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        metadata = handler_call_details.invocation_metadata or ()
        presented = [value for key, value in metadata if key == "authorization"]
        if len(presented) > 1:
            return await self._deny(continuation, handler_call_details, "more than one")
        expected = self._expected.get(method)
        if expected is None:
            return await continuation(handler_call_details)
        value = presented[0] if presented else b""
        if isinstance(value, str):
            value = value.encode()
        if hmac.compare_digest(value, expected):
            return await continuation(handler_call_details)
        reason = "wrong" if value else "missing"
        return await self._deny(continuation, handler_call_details, reason)

    async def _deny(self, continuation, handler_call_details, reason: str):
        detail = (
            f"{reason} bearer token: this call needs one `authorization: Bearer <token>` "
            f"header ({self._hint})"
        )
        handler = await continuation(handler_call_details)  # only to learn its shape
        streaming = handler is not None and handler.response_streaming

        # Stream-request handlers whatever the method: they never read the request, so a
        # call that sends none is refused too (a unary handler would wait for one).
        async def deny(request_iterator, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, detail)

        async def deny_stream(request_iterator, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, detail)
            yield  # an async generator: the handler of a streaming response

        if streaming:
            return grpc.stream_stream_rpc_method_handler(deny_stream)
        return grpc.stream_unary_rpc_method_handler(deny)


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
