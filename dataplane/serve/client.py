"""A small asyncio client of the Inference service, timing each token as it arrives.

Used by `rimuru bench --target` and bench/loadtest_grpc.py. Times are time.monotonic()
on the client, so they include the network and the server's queue.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from rimuru.dataplane.engine.request import SamplingParams
from rimuru.dataplane.serve.convert import sampling_to_proto
from rimuru.v1 import inference_pb2 as pb
from rimuru.v1 import inference_pb2_grpc as pb_grpc


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
