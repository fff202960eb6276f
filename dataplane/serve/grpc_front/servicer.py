"""The Inference service: protos in, DataPlane calls, protos out. Nothing else lives here."""

from __future__ import annotations

import time

from opentelemetry import trace

from rimuru.dataplane.serve.grpc_front import convert
from rimuru.dataplane.serve.plane.errors import FailedPrecondition, grpc_errors
from rimuru.dataplane.serve.plane.events import FinishedEvent, RejectedEvent, TokensEvent
from rimuru.dataplane.serve.plane.plane import DataPlane
from rimuru.v1 import inference_pb2 as pb
from rimuru.v1 import inference_pb2_grpc as pb_grpc


class InferenceServicer(pb_grpc.InferenceServicer):
    def __init__(self, plane: DataPlane, tracer: trace.Tracer) -> None:
        self._plane = plane
        self._tracer = tracer

    @grpc_errors
    async def Generate(self, request: pb.GenerateRequest, context):
        arrival = time.monotonic()
        info = self._plane.require_serving()
        tokenizer = self._plane.tokenizer
        spec = convert.generate_spec(request, info, tokenizer, arrival)
        stream = self._plane.open_stream(spec)
        request_id = request.request_id or stream.engine_id
        detok = tokenizer.detokenizer() if tokenizer is not None else None
        # A span per request (GenAI conventions); a no-op unless a TracerProvider is set.
        span = self._tracer.start_span(
            f"text_completion {info.model_name}",
            kind=trace.SpanKind.SERVER,
            attributes={
                "gen_ai.operation.name": "text_completion",
                "gen_ai.request.model": info.model_name,
                "gen_ai.request.max_tokens": spec.params.max_tokens,
                "gen_ai.request.temperature": spec.params.temperature,
                "gen_ai.usage.input_tokens": len(spec.prompt_token_ids),
                "rimuru.request_id": request_id,
            },
        )
        try:
            async for event in stream:
                if isinstance(event, TokensEvent):
                    text = detok.add(event.token_ids) if detok is not None else ""
                    yield pb.GenerateResponse(
                        request_id=request_id,
                        delta=pb.TokenDelta(token_ids=event.token_ids, text=text),
                    )
                elif isinstance(event, FinishedEvent):
                    tail = detok.flush() if detok is not None else ""
                    if tail:
                        yield pb.GenerateResponse(
                            request_id=request_id, delta=pb.TokenDelta(text=tail)
                        )
                    span.set_attribute("gen_ai.usage.output_tokens", event.usage.completion_tokens)
                    span.set_attribute("gen_ai.response.finish_reasons", (event.finish_reason,))
                    yield convert.final_response(request_id, event)
                elif isinstance(event, RejectedEvent):
                    span.set_status(trace.Status(trace.StatusCode.ERROR, str(event.error)))
                    raise event.error
        finally:
            if not stream.done:
                span.set_attribute("rimuru.cancelled", True)  # client cancel or deadline
            stream.close(_why_ended(context))
            span.end()

    @grpc_errors
    async def Tokenize(self, request: pb.TokenizeRequest, context) -> pb.TokenizeResponse:
        info = self._plane.require_serving()
        if self._plane.tokenizer is None:
            raise FailedPrecondition(f"model {info.model_name!r} has no tokenizer on this server")
        return pb.TokenizeResponse(token_ids=self._plane.tokenizer.encode(request.text))

    @grpc_errors
    async def ModelInfo(self, request: pb.ModelInfoRequest, context) -> pb.ModelInfoResponse:
        if self._plane.info is None:
            self._plane.require_serving()  # raises the state's error
        return convert.model_info_response(self._plane.info)

    @grpc_errors
    async def EngineStats(self, request: pb.EngineStatsRequest, context) -> pb.EngineStatsResponse:
        return convert.engine_stats_response(self._plane.snapshot())


# The client's deadline fires on its side first and cancels the call, so the server may
# see the cancel a moment before its own copy of the deadline passes.
_DEADLINE_SLACK_S = 0.05


def _why_ended(context) -> str:
    """Why a Generate stream ended early: "deadline" or "cancelled" (the metric's label)."""
    remaining = context.time_remaining()
    return "deadline" if remaining is not None and remaining < _DEADLINE_SLACK_S else "cancelled"
