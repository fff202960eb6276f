"""Health follows the lifecycle (loading -> serving -> draining); reflection; drain on stop."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from rimuru.v1 import inference_pb2 as pb

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def _rest(call) -> list[pb.GenerateResponse]:
    """The remaining responses of a call already read from with read()."""
    responses = []
    while (response := await call.read()) is not grpc.aio.EOF:
        responses.append(response)
    return responses


async def _generate_code(dp, **sampling) -> grpc.StatusCode:
    request = pb.GenerateRequest(
        token_ids=pb.TokenIds(ids=[1, 2]), sampling=pb.SamplingParams(**sampling)
    )
    try:
        async for _ in dp.stub.Generate(request):
            pass
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def test_not_serving_until_the_engine_is_warm_then_serving(start_data_plane):
    dp = await start_data_plane(start_engine=False)
    assert await dp.health() == NOT_SERVING
    assert await dp.health("rimuru.v1.Inference") == NOT_SERVING
    assert await _generate_code(dp) == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await dp.stub.ModelInfo(pb.ModelInfoRequest())
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    info = await dp.handle.start()
    assert info.model_name == "tiny"
    assert await dp.health() == SERVING
    assert await dp.health("rimuru.v1.Inference") == SERVING
    # warmed up: the warm-up request ran and left nothing behind
    assert await dp.engine(lambda e: e.step_id) > 0
    assert await dp.leak_check() == (0, 0)


async def test_reflection_lists_the_services(data_plane):
    stub = reflection_pb2_grpc.ServerReflectionStub(data_plane.channel)
    responses = stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")])
    )
    names = {s.name async for r in responses for s in r.list_services_response.service}
    assert {"rimuru.v1.Inference", "grpc.health.v1.Health"} <= names


async def test_shutdown_drains_in_flight_streams_and_refuses_new_ones(data_plane):
    dp = data_plane
    request = pb.GenerateRequest(
        token_ids=pb.TokenIds(ids=[3, 4, 5]),
        sampling=pb.SamplingParams(max_tokens=40, ignore_eos=True),
    )
    call = dp.stub.Generate(request)
    assert (await call.read()).HasField("delta")
    shutdown = asyncio.create_task(dp.handle.shutdown(grace_s=30))
    await asyncio.sleep(0.05)
    assert await dp.health() == NOT_SERVING
    assert await _generate_code(dp) == grpc.StatusCode.UNAVAILABLE
    rest = await _rest(call)
    assert rest[-1].final.finish_reason == pb.FINISH_REASON_LENGTH
    assert rest[-1].final.usage.completion_tokens == 40
    assert await shutdown == 0  # nothing had to be aborted


async def test_streams_past_the_grace_period_end_with_reason_abort(data_plane):
    request = pb.GenerateRequest(
        token_ids=pb.TokenIds(ids=[3, 4, 5]),
        sampling=pb.SamplingParams(max_tokens=1000, ignore_eos=True),
    )
    calls = [data_plane.stub.Generate(request) for _ in range(3)]
    for call in calls:
        assert (await call.read()).HasField("delta")
    shutdown = asyncio.create_task(data_plane.handle.shutdown(grace_s=0.2))
    for call in calls:
        rest = await _rest(call)
        final = rest[-1].final
        assert final.finish_reason == pb.FINISH_REASON_ABORT
        assert 1 <= final.usage.completion_tokens < 1000
    assert await shutdown == 3


async def test_an_engine_failure_fails_the_streams_and_turns_health_off(data_plane, eventually):
    request = pb.GenerateRequest(
        token_ids=pb.TokenIds(ids=[3, 4, 5]),
        sampling=pb.SamplingParams(max_tokens=1000, ignore_eos=True),
    )
    call = data_plane.stub.Generate(request)
    assert (await call.read()).HasField("delta")
    # Break the real engine from its own thread: the next step raises.
    await data_plane.engine(lambda engine: setattr(engine, "model", None))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _rest(call)
    assert info.value.code() == grpc.StatusCode.INTERNAL

    async def unhealthy() -> bool:
        return await data_plane.health() == NOT_SERVING

    await eventually(unhealthy, what="health NOT_SERVING")
    assert data_plane.handle.plane.state == "failed"
    assert await _generate_code(data_plane) == grpc.StatusCode.INTERNAL
