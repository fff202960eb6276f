"""Assemble the control plane's gRPC server: servicers, auth, health, reflection, TLS."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from rimuru.controlplane.auth import BearerTokenInterceptor
from rimuru.controlplane.plane import ControlPlane
from rimuru.controlplane.servicers import PolicyDiscoveryServicer, PolicyServicer
from rimuru.rpc import (
    EXCLUSIVE_PORT,
    MAX_MESSAGE_BYTES,
    RequestChecks,
    TlsFiles,
    bind,
    message_size_options,
)
from rimuru.v1 import control_pb2, control_pb2_grpc

# Pings end a WatchPolicy stream whose data plane vanished without closing it, so the
# node's record frees up for its reconnect (a connected node id is refused; subscribers.py).
SERVER_OPTIONS = (
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
)
SERVICE_NAMES = tuple(s.full_name for s in control_pb2.DESCRIPTOR.services_by_name.values())


async def create_server(
    address: str,
    plane: ControlPlane,
    *,
    token: str | None = None,
    dataplane_token: str | None = None,
    tls: TlsFiles | None = None,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
) -> tuple[grpc.aio.Server, int]:
    """A ready-to-start server bound to `address` ("127.0.0.1:0" picks a free port).

    token: the operator's (policy writes); dataplane_token: the data planes' (WatchPolicy,
    ReportRouting); auth.py says what each allows. No token = everything open.
    max_message_bytes: the send and receive limit; a ranking or policy whose push would
    exceed it is refused (INVALID_ARGUMENT), uploaded or proposed by online hotness from
    routing reports, so every push fits a data plane's limit.
    Call it in the event loop that will run the server; the caller starts and stops it.
    """
    if dataplane_token and not token:
        raise ValueError("a data-plane token needs an operator token as well")
    # Auth first: an unauthenticated call is refused as such, whatever its bytes.
    interceptors = [BearerTokenInterceptor(token, dataplane_token)] if token else []
    interceptors.append(RequestChecks())
    server = grpc.aio.server(
        interceptors=interceptors,
        options=SERVER_OPTIONS + EXCLUSIVE_PORT + message_size_options(max_message_bytes),
    )
    control_pb2_grpc.add_PolicyServiceServicer_to_server(
        PolicyServicer(plane, max_message_bytes), server
    )
    control_pb2_grpc.add_PolicyDiscoveryServiceServicer_to_server(
        PolicyDiscoveryServicer(plane, max_message_bytes), server
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    # The store is open before the server exists: serving from the first request.
    for name in ("", *SERVICE_NAMES):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection(
        (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    port = bind(server, address, tls, "the control plane")
    return server, port
