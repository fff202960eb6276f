"""Streams that end early (client cancel, deadline) abort their request and free its pages."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace

import grpc
import pytest

from rimuru.v1 import inference_pb2 as pb

LONG = pb.SamplingParams(max_tokens=1000, ignore_eos=True)  # never finishes within a test


def _request(rng: random.Random) -> pb.GenerateRequest:
    ids = [rng.randrange(151_000) for _ in range(rng.randint(1, 40))]
    return pb.GenerateRequest(token_ids=pb.TokenIds(ids=ids), sampling=LONG)


async def _all_released(data_plane, eventually) -> None:
    async def released() -> bool:
        return data_plane.handle.plane.num_streams == 0 and await data_plane.leak_check() == (0, 0)

    await eventually(released, what="every aborted request released")


async def test_a_thousand_cancelled_streams_leak_no_pages(data_plane, eventually):
    rng = random.Random(0)
    cancelled = 0
    for _ in range(10):
        calls = [data_plane.stub.Generate(_request(rng)) for _ in range(100)]
        # Half are cancelled mid-decode (their KV pages allocated), half at once (waiting,
        # in the inbox, or scheduled in the step under way).
        firsts = await asyncio.gather(*(call.read() for call in calls[:50]))
        assert all(first.HasField("delta") for first in firsts)
        for call in calls:
            assert call.cancel()
        for call in calls:
            assert await call.code() == grpc.StatusCode.CANCELLED
        cancelled += len(calls)
    assert cancelled == 1000
    await _all_released(data_plane, eventually)
    stats = await data_plane.stats()
    assert stats.num_requests_running == stats.num_requests_waiting == stats.num_kv_pages == 0
    tokens, final = await data_plane.generate([1, 2, 3], max_tokens=4, ignore_eos=True)
    assert len(tokens) == 4 and final.finish_reason == pb.FINISH_REASON_LENGTH


async def test_expired_deadlines_abort_and_leak_no_pages(data_plane, eventually):
    rng = random.Random(1)

    async def until_deadline(timeout: float) -> grpc.StatusCode:
        received = 0
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in data_plane.stub.Generate(_request(rng), timeout=timeout):
                received += 1
        return info.value.code(), received

    results = await asyncio.gather(*(until_deadline(0.2 + 0.03 * i) for i in range(60)))
    assert {code for code, _ in results} == {grpc.StatusCode.DEADLINE_EXCEEDED}
    assert max(received for _, received in results) > 0  # some were mid-stream
    await _all_released(data_plane, eventually)


async def test_past_max_waiting_is_resource_exhausted(start_data_plane, small_config, eventually):
    dp = await start_data_plane(replace(small_config, max_num_seqs=1), max_waiting=1)
    rng = random.Random(2)
    running = dp.stub.Generate(_request(rng))
    assert (await running.read()).HasField("delta")  # the one batch slot is taken
    waiting = dp.stub.Generate(_request(rng))

    async def one_waiting() -> bool:
        return (await dp.stats()).num_requests_waiting == 1

    await eventually(one_waiting, what="the second request waiting")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in dp.stub.Generate(_request(rng)):
            pass
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--max-waiting 1" in info.value.details()
    running.cancel()
    assert (await waiting.read()).HasField("delta")  # it moved up into the batch
    waiting.cancel()
    await _all_released(dp, eventually)
