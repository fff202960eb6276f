"""Bearer-token check for the write methods; reads stay open.

Writes are SetPolicy and UploadRanking, and ReportRouting: routing reports move the online
hotness ranking, which becomes new policy versions pushed to every data plane."""

from __future__ import annotations

import hmac

import grpc

from rimuru.controlplane.errors import Unauthenticated
from rimuru.controlplane.status import code_for

WRITE_METHODS = frozenset(
    {
        "/rimuru.v1.PolicyService/SetPolicy",
        "/rimuru.v1.PolicyService/UploadRanking",
        "/rimuru.v1.PolicyDiscoveryService/ReportRouting",
    }
)
CLIENT_STREAMING = frozenset({"/rimuru.v1.PolicyDiscoveryService/ReportRouting"})


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
    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("token must be non-empty; pass no interceptor to leave writes open")
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(self, continuation, handler_call_details):
        if handler_call_details.method not in WRITE_METHODS:
            return await continuation(handler_call_details)
        metadata = dict(handler_call_details.invocation_metadata or ())
        presented = metadata.get("authorization", "")
        if isinstance(presented, str):
            presented = presented.encode()
        if hmac.compare_digest(presented, self._expected):
            return await continuation(handler_call_details)
        reason = "missing" if not presented else "wrong"
        if handler_call_details.method in CLIENT_STREAMING:
            return grpc.stream_unary_rpc_method_handler(_deny(reason))
        return grpc.unary_unary_rpc_method_handler(_deny(reason))


def _deny(reason: str):
    error = Unauthenticated(
        f"{reason} bearer token: writes need `authorization: Bearer <token>` metadata "
        "(rimuru policy --token-file PATH)"
    )

    async def deny(request, context):
        await context.abort(code_for(error), str(error))

    return deny
