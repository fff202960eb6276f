"""Real control planes on port 0, in the test's event loop."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from rimuru.controlplane.hotness import HotnessConfig
from rimuru.controlplane.plane import ControlPlane
from rimuru.controlplane.server import create_server
from rimuru.rpc import MAX_MESSAGE_BYTES
from rimuru.v1 import control_pb2_grpc as pb_grpc

TOKEN = "test-token-0123"


@dataclass
class RunningControlPlane:
    plane: ControlPlane
    server: grpc.aio.Server
    port: int

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def stop(self) -> None:
        await self.server.stop(None)
        self.plane.close()


@pytest.fixture
async def start_control_plane(tmp_path: Path):
    """start(data_dir=tmp, port=0, token=None, hotness=None, max_message_bytes) -> it."""
    running: list[RunningControlPlane] = []

    async def start(
        data_dir: Path | None = tmp_path / "cp",
        *,
        port: int = 0,
        token: str | None = None,
        hotness: HotnessConfig | None = None,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ) -> RunningControlPlane:
        plane = ControlPlane.open(data_dir, hotness)
        server, bound = await create_server(
            f"127.0.0.1:{port}", plane, token=token, max_message_bytes=max_message_bytes
        )
        await server.start()
        cp = RunningControlPlane(plane, server, bound)
        running.append(cp)
        return cp

    yield start
    for cp in running:
        await cp.server.stop(None)
        cp.plane.close()


@pytest.fixture
async def cp(start_control_plane) -> RunningControlPlane:
    return await start_control_plane(token=TOKEN)


@pytest.fixture
async def channel(cp: RunningControlPlane):
    async with grpc.aio.insecure_channel(cp.target) as ch:
        yield ch


@pytest.fixture
def policy_stub(channel) -> pb_grpc.PolicyServiceStub:
    return pb_grpc.PolicyServiceStub(channel)


@pytest.fixture
def discovery_stub(channel) -> pb_grpc.PolicyDiscoveryServiceStub:
    return pb_grpc.PolicyDiscoveryServiceStub(channel)


@pytest.fixture
def auth() -> tuple[tuple[str, str], ...]:
    """Call metadata that passes the control plane's token check."""
    return (("authorization", f"Bearer {TOKEN}"),)
