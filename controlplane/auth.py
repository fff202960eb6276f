"""Bearer-token checks: the operator's token for policy writes, the data planes' for theirs.

Two credentials, so a data-plane pod (which must hold one) cannot rewrite policy:

    method                               needs
    SetPolicy, UploadRanking             the operator token (--token-file)
    WatchPolicy, ReportRouting           the data-plane token (--dataplane-token-file);
                                         without one: ReportRouting the operator token
                                         (one shared token, as before), WatchPolicy none
    reads (GetPolicy, ListSubscribers..) none

ReportRouting is a write: routing reports move the online hotness ranking, which becomes
new policy versions pushed to every data plane. A call with more than one
`authorization` header is refused whatever they hold.
"""

from __future__ import annotations

import hmac

import grpc

from rimuru.controlplane.errors import Unauthenticated
from rimuru.controlplane.status import code_for

OPERATOR_METHODS = frozenset(
    {
        "/rimuru.v1.PolicyService/SetPolicy",
        "/rimuru.v1.PolicyService/UploadRanking",
    }
)
REPORT_ROUTING = "/rimuru.v1.PolicyDiscoveryService/ReportRouting"
WATCH_POLICY = "/rimuru.v1.PolicyDiscoveryService/WatchPolicy"
BIDI_STREAMING = frozenset({WATCH_POLICY})


def read_token_file(path: str) -> str:
    """The token is the file's content without surrounding whitespace (a mounted Secret)."""
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as exc:
        raise SystemExit(f"cannot read the token file {path}: {exc}") from exc
    if not token:
        raise SystemExit(f"the token file {path} is empty: put the bearer token in it")
    return token


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, token: str, dataplane_token: str | None = None) -> None:
        """token: the operator's; dataplane_token: the data planes' (None = see above)."""
        if not token or dataplane_token == "":
            raise ValueError("tokens must be non-empty; pass no interceptor to leave writes open")
        if dataplane_token == token:
            raise ValueError("the data-plane token must differ from the operator token")
        operator = _expected(token)
        dataplane = _expected(dataplane_token) if dataplane_token else None
        self._accepted: dict[str, bytes] = dict.fromkeys(OPERATOR_METHODS, operator)
        self._accepted[REPORT_ROUTING] = dataplane or operator
        if dataplane is not None:
            self._accepted[WATCH_POLICY] = dataplane

    async def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        metadata = handler_call_details.invocation_metadata or ()
        presented = [value for key, value in metadata if key == "authorization"]
        if len(presented) > 1:
            return _deny_handler(method, "more than one")
        expected = self._accepted.get(method)
        if expected is None:
            return await continuation(handler_call_details)
        value = presented[0] if presented else b""
        if isinstance(value, str):
            value = value.encode()
        if hmac.compare_digest(value, expected):
            return await continuation(handler_call_details)
        return _deny_handler(method, "wrong" if value else "missing")


def _expected(token: str) -> bytes:
    return f"Bearer {token}".encode()


def _deny_handler(method: str, reason: str) -> grpc.RpcMethodHandler:
    error = Unauthenticated(
        f"{reason} bearer token: this call needs one `authorization: Bearer <token>` header "
        "(policy writes: the operator token, rimuru policy --token-file PATH; data planes: "
        "theirs, rimuru serve --token-file PATH)"
    )

    # Stream-request handlers whatever the method: they never read the request, so a call
    # that sends none is refused too (a unary handler would wait for one; see rimuru.rpc).
    async def deny(request_iterator, context):
        await context.abort(code_for(error), str(error))

    async def deny_stream(request_iterator, context):
        await context.abort(code_for(error), str(error))
        yield  # an async generator: the handler of a streaming response

    if method in BIDI_STREAMING:
        return grpc.stream_stream_rpc_method_handler(deny_stream)
    return grpc.stream_unary_rpc_method_handler(deny)
