"""A data plane whose engine schedules asynchronously: streams carry the tokens of synchronous
scheduling, and streams cancelled with a step in flight leak nothing."""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import replace

import grpc

from rimuru.cli import main
from rimuru.dataplane.engine.engine import Engine
from rimuru.dataplane.serve.grpc_front.convert import sampling_to_proto
from rimuru.v1 import inference_pb2 as pb

from .test_generate import PARAMS, _prompts


async def test_async_streams_equal_synchronous_scheduling(start_data_plane, small_config):
    config = replace(small_config, async_scheduling=True)
    plane = await start_data_plane(config)
    prompts = _prompts(9, seed=5)
    params = [PARAMS[i % len(PARAMS)] for i in range(len(prompts))]
    direct = Engine(small_config, log_plan=False)  # synchronous
    want = direct.generate(prompts, params)
    got = await asyncio.gather(
        *(
            plane.generate(p, **{f.name: v for f, v in sampling_to_proto(sp).ListFields()})
            for p, sp in zip(prompts, params, strict=True)
        )
    )
    assert [tokens for tokens, _ in got] == want
    assert all(final.finish_reason == pb.FINISH_REASON_LENGTH for _, final in got)
    assert await plane.leak_check() == (0, 0)


async def test_cancelled_async_streams_leak_no_pages(start_data_plane, small_config, eventually):
    plane = await start_data_plane(replace(small_config, async_scheduling=True))
    rng = random.Random(2)
    long = pb.SamplingParams(max_tokens=1000, ignore_eos=True)
    calls = [
        plane.stub.Generate(
            pb.GenerateRequest(
                token_ids=pb.TokenIds(ids=[rng.randrange(151_000) for _ in range(20)]),
                sampling=long,
            )
        )
        for _ in range(40)
    ]
    firsts = await asyncio.gather(*(call.read() for call in calls[:20]))  # decoding now
    assert all(first.HasField("delta") for first in firsts)
    for call in calls:
        assert call.cancel()
    for call in calls:
        assert await call.code() == grpc.StatusCode.CANCELLED

    async def released() -> bool:
        return plane.handle.plane.num_streams == 0 and await plane.leak_check() == (0, 0)

    await eventually(released, what="every aborted request released")
    tokens, final = await plane.generate([1, 2, 3], max_tokens=4, ignore_eos=True)
    assert len(tokens) == 4 and final.finish_reason == pb.FINISH_REASON_LENGTH


async def test_model_info_and_a_remote_bench_record_the_servers_scheduling(
    start_data_plane, small_config, tmp_path
):
    for asked in (True, False):
        plane = await start_data_plane(replace(small_config, async_scheduling=asked))
        info = await plane.stub.ModelInfo(pb.ModelInfoRequest())
        assert info.async_scheduling is asked
        out = tmp_path / str(asked)
        argv = ["bench", "--target", plane.target, "--num-prompts", "2", "--no-progress",
                "--output-dir", str(out)]  # fmt: skip
        assert await asyncio.to_thread(main, argv) == 0
        (result,) = json.loads((out / "results.json").read_text())["results"]
        assert result["config"]["schedules_async"] is asked
