"""Generate, Tokenize, ModelInfo, EngineStats over real gRPC against the engine's own output."""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest

from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.engine.sched.request import MAX_STOP_TOKEN_IDS, SamplingParams
from rimuru.dataplane.model.tokenizer import load_tokenizer
from rimuru.dataplane.serve.grpc_front.convert import sampling_to_proto
from rimuru.v1 import inference_pb2 as pb

PARAMS = [
    SamplingParams(max_tokens=12, ignore_eos=True),
    SamplingParams(max_tokens=12, temperature=0.9, top_k=50, top_p=0.9, seed=11, ignore_eos=True),
    SamplingParams(max_tokens=7, temperature=1.3, seed=2**40 + 3, ignore_eos=True),
]


def _prompts(n: int, seed: int = 3) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(151_000) for _ in range(rng.randint(3, 40))] for _ in range(n)]


async def test_streams_equal_the_engines_direct_output(data_plane, small_config):
    """Concurrent streams (batched together) = the engine run directly, request by request."""
    prompts = _prompts(9)
    params = [PARAMS[i % len(PARAMS)] for i in range(len(prompts))]
    direct = Engine(small_config, log_plan=False)
    want = [direct.generate([p], sp)[0] for p, sp in zip(prompts, params, strict=True)]
    got = await asyncio.gather(
        *(
            data_plane.generate(p, **{f.name: v for f, v in sampling_to_proto(sp).ListFields()})
            for p, sp in zip(prompts, params, strict=True)
        )
    )
    assert [tokens for tokens, _ in got] == want
    for (tokens, final), prompt in zip(got, prompts, strict=True):
        assert final.finish_reason == pb.FINISH_REASON_LENGTH
        assert final.usage.prompt_tokens == len(prompt)
        assert final.usage.completion_tokens == len(tokens)
        t = final.timing
        assert 0 <= t.queue_seconds <= t.time_to_first_token_seconds <= t.e2e_seconds
        assert t.mean_inter_token_seconds > 0
    assert await data_plane.leak_check() == (0, 0)


async def test_text_deltas_decode_the_token_deltas_and_ids_are_echoed(data_plane):
    tokenizer = load_tokenizer("qwen3_moe", 151936)
    request = pb.GenerateRequest(
        request_id="client-7",
        text="The pool holds experts and KV pages: 池",
        sampling=pb.SamplingParams(max_tokens=20, temperature=1.0, seed=5, ignore_eos=True),
    )
    responses = [r async for r in data_plane.stub.Generate(request)]
    assert {r.request_id for r in responses} == {"client-7"}
    ids = [t for r in responses if r.HasField("delta") for t in r.delta.token_ids]
    text = "".join(r.delta.text for r in responses if r.HasField("delta"))
    assert len(ids) == 20
    assert text == tokenizer.decode(ids)
    final = responses[-1].final
    assert final.usage.prompt_tokens == len(tokenizer.encode(request.text))
    tokenized = await data_plane.stub.Tokenize(pb.TokenizeRequest(text=request.text))
    assert list(tokenized.token_ids) == tokenizer.encode(request.text)


async def test_stop_token_ends_the_stream_with_reason_stop(data_plane, small_config):
    prompt = _prompts(1, seed=9)[0]
    direct = Engine(small_config, log_plan=False)
    free_run = direct.generate([prompt], SamplingParams(max_tokens=10, ignore_eos=True))[0]
    stop = free_run[4]
    tokens, final = await data_plane.generate(
        prompt, max_tokens=10, ignore_eos=True, stop_token_ids=[stop]
    )
    assert tokens == free_run[: free_run.index(stop) + 1]
    assert final.finish_reason == pb.FINISH_REASON_STOP


async def test_too_many_stop_token_ids_is_invalid_argument(data_plane):
    too_many = list(range(MAX_STOP_TOKEN_IDS + 1))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await data_plane.generate([5, 6, 7], max_tokens=2, stop_token_ids=too_many)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        f"sampling.stop_token_ids: stop_token_ids must hold at most {MAX_STOP_TOKEN_IDS} ids, "
        f"got {MAX_STOP_TOKEN_IDS + 1}"
    )
    tokens, final = await data_plane.generate(
        [5, 6, 7], max_tokens=2, ignore_eos=True, stop_token_ids=too_many[1:]
    )  # the limit itself is served
    assert 1 <= len(tokens) <= 2 and final.finish_reason != pb.FINISH_REASON_UNSPECIFIED


async def test_model_info_and_engine_stats(data_plane):
    info = await data_plane.stub.ModelInfo(pb.ModelInfoRequest())
    assert (info.model_name, info.preset, info.dtype) == ("tiny", "tiny", "float32")
    assert (info.num_layers, info.num_experts, info.num_experts_per_token) == (4, 32, 4)
    assert (info.hidden_size, info.moe_intermediate_size, info.kv_block_size) == (128, 128, 16)
    assert (info.vocab_size, info.num_kv_heads, info.head_dim) == (151936, 2, 32)
    assert list(info.eos_token_ids) == [151643, 151645]
    await data_plane.generate([1, 2, 3], max_tokens=3)
    stats = await data_plane.stats()
    assert stats.policy_mode == "elastic" and stats.policy_version == 0
    assert list(stats.num_experts_resident) == [32, 32, 32, 32]
    assert stats.num_expert_pages == 128 * 3
    assert stats.num_kv_pages == 0 and stats.kv_cache_usage_perc == 0.0
    assert stats.num_requests_running == stats.num_requests_waiting == 0
    assert 0 < stats.num_free_pages < stats.num_pool_pages


async def test_text_needs_a_tokenizer(start_data_plane):
    # A server without a tokenizer for its model (as for non-Qwen vocabularies).
    dp = await start_data_plane(tokenizer=lambda info: None)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await dp.stub.Tokenize(pb.TokenizeRequest(text="hi"))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in dp.stub.Generate(pb.GenerateRequest(text="hi")):
            pass
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "token_ids" in info.value.details()
    tokens, _ = await dp.generate([5, 6], max_tokens=2)
    assert len(tokens) == 2
