"""A request the engine gives up on after queuing it reaches its client as an error, and
the server serves on: logits that are not finite (a corrupted weight row here) are INTERNAL
on gRPC and a 500 OpenAI error over HTTP, for that request alone."""

from __future__ import annotations

import asyncio

import grpc
import httpx
import pytest

from tests.engine.test_nonfinite_logits import POISONED, poison

HEALTHY = [9707, 11, 1879, 0]


@pytest.fixture
async def dp(start_data_plane):
    dp = await start_data_plane(http_address=("127.0.0.1", 0))
    await dp.engine(lambda engine: poison(engine, float("nan")))
    return dp


async def test_non_finite_logits_fail_that_grpc_request_alone(dp):
    bad = dp.generate([5, POISONED, 6], max_tokens=4, ignore_eos=True)
    good = dp.generate(HEALTHY, max_tokens=4, ignore_eos=True)
    results = await asyncio.gather(bad, good, return_exceptions=True)
    assert isinstance(results[0], grpc.aio.AioRpcError)
    assert results[0].code() == grpc.StatusCode.INTERNAL
    assert "logits were not finite at output token 1" in results[0].details()
    tokens, final = results[1]
    assert len(tokens) == 4 and final.usage.completion_tokens == 4
    assert await dp.leak_check() == (0, 0)


async def test_non_finite_logits_are_an_openai_500(dp):
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{dp.handle.http.port}") as http:
        body = {"model": "tiny", "prompt": [5, POISONED], "max_tokens": 3}
        bad = await http.post("/v1/completions", json=body)
        good = await http.post("/v1/completions", json={**body, "prompt": HEALTHY})
    assert bad.status_code == 500
    error = bad.json()["error"]
    assert error["type"] == "internal_error" and "logits were not finite" in error["message"]
    assert good.status_code == 200 and good.json()["choices"][0]["finish_reason"] == "length"
    assert await dp.leak_check() == (0, 0)
