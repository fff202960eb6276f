"""Real data planes (and control planes) on port 0, in the test's event loop.

The engine is the CPU `tiny` preset with a small activation reserve, so start-up takes
well under a second and every test can afford its own server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.dataplane.serve.server import ServerHandle, create_server
from rimuru.policy import Tunables
from rimuru.v1 import inference_pb2 as pb
from rimuru.v1 import inference_pb2_grpc as pb_grpc

MiB = 2**20
# tiny: ~75 MiB of non-pool weights; all 128 experts take 24 MiB of pool.
SMALL = EngineConfig(
    memory_budget=160 * MiB,
    activation_reserve=8 * MiB,
    max_num_batched_tokens=512,
    loading_buffer_slots=4,
    tunables=Tunables(mode="elastic", expert_offload_limit=4),
)


@dataclass
class RunningDataPlane:
    server: grpc.aio.Server
    port: int
    handle: ServerHandle
    channel: grpc.aio.Channel
    stub: pb_grpc.InferenceStub

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def health(self, service: str = "") -> int:
        stub = health_pb2_grpc.HealthStub(self.channel)
        return (await stub.Check(health_pb2.HealthCheckRequest(service=service))).status

    async def stats(self) -> pb.EngineStatsResponse:
        return await self.stub.EngineStats(pb.EngineStatsRequest())

    async def engine(self, fn: Callable):
        return await self.handle.call_engine(fn)

    async def generate(self, ids, **sampling) -> tuple[list[int], pb.GenerateFinal]:
        """Run one request to the end: (output token ids, final message)."""
        request = pb.GenerateRequest(
            token_ids=pb.TokenIds(ids=ids), sampling=pb.SamplingParams(**sampling)
        )
        tokens: list[int] = []
        final = None
        async for response in self.stub.Generate(request):
            if response.HasField("delta"):
                tokens.extend(response.delta.token_ids)
            else:
                final = response.final
        assert final is not None, "the stream ended without a final message"
        return tokens, final

    async def leak_check(self) -> tuple[int, int]:
        """(leaked KV pages, requests the engine still remembers), invariants checked."""

        def check(engine):
            engine.check_invariants()
            return engine.num_leaked_pages(), len(engine.requests)

        return await self.engine(check)


@pytest.fixture
async def start_data_plane():
    """start(config=SMALL, start_engine=True, **create_server kwargs) -> RunningDataPlane."""
    running: list[RunningDataPlane] = []

    async def start(
        config: EngineConfig = SMALL, *, start_engine: bool = True, **kwargs
    ) -> RunningDataPlane:
        server, port, handle = await create_server(config, "127.0.0.1:0", **kwargs)
        await server.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        dp = RunningDataPlane(server, port, handle, channel, pb_grpc.InferenceStub(channel))
        running.append(dp)
        if start_engine:
            await handle.start()
        return dp

    yield start
    for dp in running:
        await dp.channel.close()
        await dp.handle.shutdown(grace_s=0)


@pytest.fixture
async def data_plane(start_data_plane) -> RunningDataPlane:
    return await start_data_plane()


@pytest.fixture
async def start_control_plane(tmp_path: Path):
    """start(port=0, hotness=None, **tokens) -> (ControlPlane, server, port); same data dir
    each time; tokens: create_server's token and dataplane_token."""
    from rimuru.controlplane.plane import ControlPlane
    from rimuru.controlplane.server import create_server as create_cp_server

    running = []

    async def start(port: int = 0, hotness=None, **tokens):
        plane = ControlPlane.open(tmp_path / "cp", hotness)
        server, bound = await create_cp_server(f"127.0.0.1:{port}", plane, **tokens)
        await server.start()
        running.append((plane, server))
        return plane, server, bound

    yield start
    for plane, server in running:
        await server.stop(None)
        plane.close()


async def _eventually(predicate, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        await asyncio.sleep(0.02)


@pytest.fixture
def eventually():
    """await eventually(async_predicate, timeout=10, what="...")."""
    return _eventually


@pytest.fixture
def small_config() -> EngineConfig:
    return SMALL


@pytest.fixture
def config_with():
    """config_with(**tunables changes) -> SMALL with those tunables."""

    def make(**changes) -> EngineConfig:
        return replace(SMALL, tunables=replace(SMALL.tunables, **changes))

    return make
