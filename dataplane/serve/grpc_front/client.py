"""A small asyncio client of the Inference service, timing each token as it arrives.

Used by `rimuru bench --target` and bench/loadtest_grpc.py; `open_channel` adds the
token and TLS a server may require. Times are time.monotonic()
on the client, so they include the network and the server's queue.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from rimuru.dataplane.engine.sched.request import SamplingParams
from rimuru.dataplane.serve.grpc_front.convert import sampling_to_proto
from rimuru.rpc import message_size_options
from rimuru.v1 import inference_pb2 as pb
from rimuru.v1 import inference_pb2_grpc as pb_grpc


def open_channel(
    target: str, *, token: str | None = None, root_certificates: bytes | None = None
) -> grpc.aio.Channel:
    """A channel to a data plane: TLS when `root_certificates` (PEM) are given, and every
    call carries `authorization: Bearer <token>` when a token is (`rimuru serve
    --api-token-file`)."""
    interceptors = [_UnaryToken(token), _StreamToken(token)] if token else None
    options = message_size_options()
    if root_certificates is None:
        return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)
    credentials = grpc.ssl_channel_credentials(root_certificates=root_certificates)
    return grpc.aio.secure_channel(target, credentials, options=options, interceptors=interceptors)


def _with_token(details: grpc.aio.ClientCallDetails, header) -> grpc.aio.ClientCallDetails:
    return details._replace(metadata=grpc.aio.Metadata(*(details.metadata or ()), header))


# Two classes: a grpc.aio channel files an interceptor under its first matching kind only.
class _UnaryToken(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await continuation(_with_token(client_call_details, self._header), request)


class _StreamToken(grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await continuation(_with_token(client_call_details, self._header), request)


@dataclass(frozen=True)
class StreamResult:
    """One Generate call as the client saw it."""

    sent_time: float
    token_ids: tuple[int, ...]
    token_times: tuple[float, ...]  # arrival of each token's delta (monotonic)
    finish_reason: str  # "length", "stop", "abort"; "" when the call failed
    prompt_tokens: int
    status: grpc.StatusCode  # OK or the failed call's code
    details: str = ""

    @property
    def ok(self) -> bool:
        return self.status == grpc.StatusCode.OK


async def stream_generate(
    stub: pb_grpc.InferenceStub,
    prompt_token_ids: Sequence[int],
    params: SamplingParams,
    *,
    request_id: str = "",
    timeout_s: float | None = None,
) -> StreamResult:
    request = pb.GenerateRequest(
        request_id=request_id,
        token_ids=pb.TokenIds(ids=list(prompt_token_ids)),
        sampling=sampling_to_proto(params),
    )
    sent = time.monotonic()
    ids: list[int] = []
    times: list[float] = []
    finish, prompt_tokens = "", len(prompt_token_ids)
    try:
        async for response in stub.Generate(request, timeout=timeout_s):
            if response.HasField("delta"):
                now = time.monotonic()
                ids.extend(response.delta.token_ids)
                times.extend([now] * len(response.delta.token_ids))
            else:
                reason = pb.FinishReason.Name(response.final.finish_reason)
                finish = reason.removeprefix("FINISH_REASON_").lower()
                prompt_tokens = response.final.usage.prompt_tokens
    except grpc.aio.AioRpcError as exc:
        return StreamResult(
            sent, tuple(ids), tuple(times), "", prompt_tokens, exc.code(), exc.details() or ""
        )
    return StreamResult(sent, tuple(ids), tuple(times), finish, prompt_tokens, grpc.StatusCode.OK)
