"""Assemble a data plane's gRPC server: Inference, health, reflection, policy, telemetry.

    server, port, handle = await create_server(EngineConfig(), "127.0.0.1:0")
    await server.start()          # listening; health NOT_SERVING
    await handle.start()          # engine built and warmed up; health SERVING
    ...
    await handle.shutdown(grace_s=30)   # NOT_SERVING, drain, stop

Health (grpc.health.v1) follows the DataPlane's state: SERVING only while it admits
requests, so a Kubernetes `grpc` readiness probe takes a loading or draining pod out of
rotation.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry import trace
from opentelemetry.sdk.metrics.export import MetricReader

from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.dataplane.model.tokenizer import Tokenizer, load_tokenizer
from rimuru.dataplane.parallel.launch import start_engine
from rimuru.dataplane.serve.grpc_front.control import ControlPlaneLink, PolicyFollower
from rimuru.dataplane.serve.grpc_front.servicer import InferenceServicer
from rimuru.dataplane.serve.plane.engine_loop import EngineLoop
from rimuru.dataplane.serve.plane.events import ModelInfo
from rimuru.dataplane.serve.plane.plane import SERVING, DataPlane
from rimuru.dataplane.serve.plane.telemetry import ServeMetrics, prometheus_reader
from rimuru.rpc import (
    EXCLUSIVE_PORT,
    BearerTokens,
    RequestChecks,
    TlsFiles,
    bind,
    message_size_options,
)
from rimuru.v1 import inference_pb2, inference_pb2_grpc

if TYPE_CHECKING:
    from rimuru.dataplane.serve.http_front.http_server import HttpLimits, HttpServer

log = logging.getLogger("rimuru.serve")

SERVICE_NAMES = tuple(s.full_name for s in inference_pb2.DESCRIPTOR.services_by_name.values())
# What --api-token-file guards: every Inference method; health and reflection stay open.
INFERENCE_METHODS = tuple(
    f"/{service.full_name}/{method.name}"
    for service in inference_pb2.DESCRIPTOR.services_by_name.values()
    for method in service.methods
)
_STOP_GRACE_S = 1.0  # after the drain: in-flight RPCs only need to send their last message


@dataclass
class ServerHandle:
    """Everything `create_server` wired up, and the lifecycle around the gRPC server."""

    server: grpc.aio.Server
    plane: DataPlane
    metrics: ServeMetrics
    health: health.aio.HealthServicer
    follower: PolicyFollower | None
    http: HttpServer | None = None  # the OpenAI-compatible API, when asked for
    _shutdown: asyncio.Task | None = None

    async def start(self) -> ModelInfo:
        """Build and warm up the engine (off the event loop), then serve and follow policy."""
        if self.http is not None:
            await self.http.start()  # answers 503 until the engine is ready
        info = await self.plane.start()
        self.metrics.set_model(info.model_name)
        if self.follower is not None:
            self.follower.start()
        return info

    async def shutdown(self, grace_s: float) -> int:
        """Stop admitting, drain within grace_s, stop. Returns the number of aborted streams.

        Idempotent: a second call waits for the first one's result."""
        if self._shutdown is None:
            self._shutdown = asyncio.ensure_future(self._stop_all(grace_s))
        return await asyncio.shield(self._shutdown)

    async def _stop_all(self, grace_s: float) -> int:
        aborted = await self.plane.drain(grace_s)
        if self.http is not None:
            await self.http.stop()
        if self.follower is not None:
            await self.follower.stop()
        await self.server.stop(_STOP_GRACE_S)
        await self.plane.stop()
        self.metrics.shutdown()
        return aborted

    async def call_engine(self, fn: Callable[[Engine], Any]) -> Any:
        """Run fn(engine) on the engine thread between two steps (tests, introspection)."""
        return await asyncio.wrap_future(self.plane.engine.call(fn))


def default_tokenizer(info: ModelInfo) -> Tokenizer | None:
    try:
        return load_tokenizer(info.family, info.vocab_size)
    except ImportError as exc:  # a slim image: serve token ids rather than not at all
        log.warning("no tokenizer (%s): text input is refused; install rimuru[engine]", exc)
        return None


async def create_server(
    engine_config: EngineConfig,
    address: str,
    *,
    max_waiting: int | None = None,
    control_plane: ControlPlaneLink | None = None,
    metric_readers: Iterable[MetricReader] = (),
    tracer_provider: trace.TracerProvider | None = None,
    tokenizer: Callable[[ModelInfo], Tokenizer | None] = default_tokenizer,
    http_address: tuple[str, int] | None = None,
    http_limits: HttpLimits | None = None,
    api_token: str | None = None,
    tls: TlsFiles | None = None,
) -> tuple[grpc.aio.Server, int, ServerHandle]:
    """A server bound to `address` ("127.0.0.1:0" picks a free port), not yet started.

    Call it in the event loop that will run the server. The engine is built by
    `handle.start()` on its own thread.
    `tokenizer` picks the model's tokenizer (None: token ids only, text is refused).
    `http_address` (host, port): also serve the OpenAI-compatible HTTP API there
    (`handle.http.port`), with its own /metrics, within `http_limits` (default HttpLimits()).
    `api_token`: Inference calls need `authorization: Bearer <api_token>` (UNAUTHENTICATED
    otherwise); `tls`: serve TLS instead of plaintext.
    """
    metric_readers = list(metric_readers)
    registry = None
    if http_address is not None:
        reader, registry = prometheus_reader()
        metric_readers.append(reader)
    metrics = ServeMetrics(metric_readers)
    engine_loop = EngineLoop(
        lambda: start_engine(engine_config), max_waiting=max_waiting, observer=metrics
    )
    plane = DataPlane(engine_loop, load_tokenizer=tokenizer)
    tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer("rimuru.serve")
    # Auth first: an unauthenticated call is refused as such, whatever its bytes.
    interceptors: list[grpc.aio.ServerInterceptor] = []
    if api_token is not None:
        hint = "rimuru generate/bench --token-file PATH, the file `rimuru serve --api-token-file` reads"
        interceptors.append(BearerTokens(dict.fromkeys(INFERENCE_METHODS, api_token), hint))
    interceptors.append(RequestChecks())
    server = grpc.aio.server(
        interceptors=interceptors, options=EXCLUSIVE_PORT + message_size_options()
    )
    inference_pb2_grpc.add_InferenceServicer_to_server(InferenceServicer(plane, tracer), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    await _set_health(health_servicer, serving=False)
    plane.on_state_change(
        lambda state: asyncio.ensure_future(_set_health(health_servicer, state == SERVING))
    )
    reflection.enable_server_reflection(
        (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    port = bind(server, address, tls, "the data plane")
    follower = PolicyFollower(control_plane, engine_loop) if control_plane is not None else None
    http = None
    if http_address is not None:  # imported here: a gRPC-only server needs no FastAPI
        from rimuru.dataplane.serve.http_front.chat_template import load_chat_template
        from rimuru.dataplane.serve.http_front.http_server import HttpLimits, HttpServer
        from rimuru.dataplane.serve.http_front.openai_app import create_app

        limits = http_limits or HttpLimits()
        template = load_chat_template(engine_config.model)
        http = HttpServer(
            create_app(plane, template, registry, api_token, limits), *http_address, limits
        )
    return server, port, ServerHandle(server, plane, metrics, health_servicer, follower, http)


async def _set_health(servicer: health.aio.HealthServicer, serving: bool) -> None:
    status = (
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    for name in ("", *SERVICE_NAMES):
        await servicer.set(name, status)
