"""The OpenAI-compatible HTTP API (--http-port), through the official `openai` client.

A real data plane on port 0 serves gRPC and HTTP from one engine thread, so the HTTP
answers are checked against gRPC Generate's tokens for the same prompt and sampling.
"""

from __future__ import annotations

import asyncio
import json
import random

import httpx
import openai
import pytest

from rimuru.dataplane.serve.http_front.chat_template import chatml
from rimuru.dataplane.serve.http_front.stop_strings import StopSet, StopStrings
from rimuru.dataplane.serve.plane.plane import DRAINING
from rimuru.v1 import inference_pb2 as pb

MODEL = "tiny"
IDS = [9707, 11, 1879, 0, 576, 6722, 315, 9625, 374]
EOS = (151643, 151645)


@pytest.fixture
async def dp(start_data_plane):
    return await start_data_plane(http_address=("127.0.0.1", 0))


@pytest.fixture
async def client(dp):
    c = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{dp.handle.http.port}/v1", api_key="none", max_retries=0
    )
    yield c
    await c.close()


def _url(dp, path: str) -> str:
    return f"http://127.0.0.1:{dp.handle.http.port}{path}"


async def _grpc_text(dp, **kwargs) -> list[int]:
    tokens = []
    async for r in dp.stub.Generate(pb.GenerateRequest(**kwargs)):
        if r.HasField("delta"):
            tokens.extend(r.delta.token_ids)
    return tokens


# ---------------------------------------------------------------- completions
async def test_greedy_completion_equals_grpc_generate(dp, client):
    expected, _ = await dp.generate(IDS, max_tokens=12, ignore_eos=True)
    extra = {"ignore_eos": True, "return_token_ids": True}
    r = await client.completions.create(
        model=MODEL, prompt=IDS, max_tokens=12, temperature=0, extra_body=extra
    )
    (choice,) = r.choices
    assert choice.token_ids == expected
    assert choice.text == dp.handle.plane.tokenizer.decode(expected)
    assert choice.finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(IDS), 12)
    assert r.model == MODEL and r.object == "text_completion"

    stream = await client.completions.create(
        model=MODEL,
        prompt=IDS,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=extra,
    )
    chunks = [c async for c in stream]
    streamed = [t for c in chunks for ch in c.choices for t in ch.token_ids]
    assert streamed == expected
    assert "".join(ch.text for c in chunks for ch in c.choices) == choice.text
    assert [ch.finish_reason for c in chunks for ch in c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


async def test_text_prompt_equals_grpc_text(dp, client):
    prompt = "The capital of France is"
    expected = await _grpc_text(
        dp, text=prompt, sampling=pb.SamplingParams(max_tokens=8, ignore_eos=True)
    )
    r = await client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=8,
        temperature=0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    assert r.choices[0].token_ids == expected
    assert r.usage.prompt_tokens == len(dp.handle.plane.tokenizer.encode(prompt))


async def test_seeded_sampling_is_reproducible_and_n_uses_seed_plus_index(dp, client):
    sampling = {"temperature": 0.9, "top_p": 0.95}
    extra = {"top_k": 50, "ignore_eos": True, "return_token_ids": True}

    async def sample(seed: int, n: int = 1) -> list[list[int]]:
        r = await client.completions.create(
            model=MODEL, prompt=IDS, max_tokens=10, seed=seed, n=n, extra_body=extra, **sampling
        )
        return [c.token_ids for c in sorted(r.choices, key=lambda c: c.index)]

    (a,) = await sample(7)
    (b,) = await sample(7)
    assert a == b
    grpc_tokens, _ = await dp.generate(
        IDS, max_tokens=10, seed=7, top_k=50, ignore_eos=True, **sampling
    )
    assert a == grpc_tokens
    (c,) = await sample(8)
    assert await sample(7, n=2) == [a, c]  # choice i samples with seed + i, as vLLM's
    assert a != c


async def test_stop_strings_trim_the_text_and_end_the_request(dp, client):
    extra = {"ignore_eos": True, "return_token_ids": True}
    full = await client.completions.create(
        model=MODEL, prompt=IDS, max_tokens=16, temperature=0, extra_body=extra
    )
    text = full.choices[0].text
    stop = text[5:8]
    cut = text[: text.index(stop)]
    for stream in (False, True):
        r = await client.completions.create(
            model=MODEL,
            prompt=IDS,
            max_tokens=16,
            temperature=0,
            stop=[stop, "never seen"],
            stream=stream,
            extra_body=extra,
        )
        choices = [ch async for c in r for ch in c.choices] if stream else r.choices
        assert "".join(ch.text for ch in choices) == cut
        assert choices[-1].finish_reason == "stop"
        assert len([t for ch in choices for t in ch.token_ids]) < 16
    # stop_token_ids (vLLM's): the output ends with the first such token
    tokens = full.choices[0].token_ids
    k = tokens.index(tokens[2])
    r = await client.completions.create(
        model=MODEL,
        prompt=IDS,
        max_tokens=16,
        temperature=0,
        extra_body={**extra, "stop_token_ids": [tokens[2]]},
    )
    assert r.choices[0].token_ids == tokens[: k + 1]
    assert r.choices[0].finish_reason == "stop"


def test_stop_strings_hold_back_only_what_could_still_match():
    s = StopStrings(StopSet(("abc",)))
    assert s.add("xxa") == "xx"  # "a" may start "abc"
    assert s.add("bd") == "abd"
    assert s.add("ab") == ""
    assert s.add("cz") == "" and s.stopped
    assert StopStrings(StopSet(("END",))).add("no") == "no"
    t = StopStrings(StopSet(("END",)))
    assert t.add("E") == "" and t.flush() == "E"


# ---------------------------------------------------------------- chat
async def test_chat_uses_chatml_and_equals_grpc(dp, client):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is a Mixture-of-Experts model?"},
    ]
    tokenizer = dp.handle.plane.tokenizer
    prompt = tokenizer.encode(chatml(messages))
    expected, _ = await dp.generate(prompt, max_tokens=10, stop_token_ids=[151645])
    text = tokenizer.decode([t for t in expected if t not in EOS])
    r = await client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=10, temperature=0
    )
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == text
    assert r.usage.prompt_tokens == len(prompt)
    assert r.usage.completion_tokens == len(expected)

    stream = await client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-2].choices[0].finish_reason in ("length", "stop")
    assert chunks[-1].usage.total_tokens == len(prompt) + len(expected)


async def test_chat_template_from_the_model_directory(tmp_path):
    from rimuru.dataplane.serve.http_front.chat_template import load_chat_template

    assert load_chat_template("tiny").is_chatml
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}]"
                "{{ m.content }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}",
                "bos_token": {"content": "<s>"},
            }
        )
    )
    template = load_chat_template(str(tmp_path))
    assert not template.is_chatml
    assert template.render([{"role": "user", "content": "hi"}]) == "<s>[user]hi[assistant]"


# ---------------------------------------------------------------- errors, models, health
async def test_bad_requests_get_openai_errors(dp, client):
    cases = [
        ({"prompt": IDS, "top_p": 3.0}, 400, "top_p"),
        ({"prompt": IDS, "temperature": -1.0}, 400, "temperature"),
        ({"prompt": IDS, "max_tokens": 10**6}, 400, "max_tokens"),
        ({"prompt": [1, 10**7]}, 400, "prompt[1]"),
        ({"prompt": IDS, "n": 0}, 400, "n"),
        ({"prompt": IDS, "logprobs": 2}, 400, "logprobs"),
        ({"prompt": IDS, "seed": -1}, 400, "seed"),
        ({"prompt": ""}, 400, "prompt"),
    ]
    for kwargs, status, param in cases:
        for stream in (False, True):
            with pytest.raises(openai.APIStatusError) as info:
                await client.completions.create(model=MODEL, stream=stream, **kwargs)
            assert info.value.status_code == status, kwargs
            assert info.value.body["param"] == param, kwargs
            assert info.value.body["type"] == "invalid_request_error"
            assert param.split("[")[0] in info.value.body["message"]
    with pytest.raises(openai.NotFoundError) as info:
        await client.completions.create(model="gpt-4", prompt="hi")
    assert info.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model=MODEL, messages=[])
    assert info.value.body["param"] == "messages"
    async with httpx.AsyncClient() as http:
        r = await http.post(_url(dp, "/v1/completions"), json={"model": MODEL})  # no prompt
        assert r.status_code == 400
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["param"] == "prompt"
    assert (await dp.leak_check()) == (0, 0)


async def test_models_health_and_metrics(dp, client):
    models = await client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    await client.completions.create(model=MODEL, prompt=IDS, max_tokens=3)
    async with httpx.AsyncClient() as http:
        assert (await http.get(_url(dp, "/health"))).status_code == 200
        metrics = (await http.get(_url(dp, "/metrics"))).text
    assert 'rimuru_generation_tokens_total{model_name="tiny"} 3.0' in metrics
    assert "rimuru_num_requests_running" in metrics


async def test_draining_server_answers_503(dp, client):
    long = await client.completions.create(
        model=MODEL, prompt=IDS, max_tokens=500, stream=True, extra_body={"ignore_eos": True}
    )
    shutdown = asyncio.ensure_future(dp.handle.shutdown(grace_s=10))
    while dp.handle.plane.state != DRAINING:
        await asyncio.sleep(0.01)
    with pytest.raises(openai.APIStatusError) as info:
        await client.completions.create(model=MODEL, prompt=IDS, max_tokens=3)
    assert info.value.status_code == 503
    assert info.value.body["type"] == "service_unavailable_error"
    async with httpx.AsyncClient() as http:
        assert (await http.get(_url(dp, "/health"))).status_code == 503
    await long.close()  # the in-flight stream ends; the drain completes
    assert await shutdown == 0


# ---------------------------------------------------------------- disconnects
NUM_DISCONNECTS = 1000


async def test_disconnected_streams_free_their_pages(dp, client, eventually):
    rng = random.Random(0)
    extra = {"ignore_eos": True}

    async def open_stream():
        prompt = [rng.randrange(151_000) for _ in range(rng.randint(1, 40))]
        return await client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=1000, stream=True, extra_body=extra
        )

    for _ in range(NUM_DISCONNECTS // 100):
        streams = await asyncio.gather(*(open_stream() for _ in range(100)))
        # Half leave mid-decode (after a token), half as soon as the headers came.
        firsts = await asyncio.gather(*(anext(aiter(s)) for s in streams[:50]))
        assert all(f.choices[0].text is not None for f in firsts)
        await asyncio.gather(*(s.close() for s in streams))

    async def released() -> bool:
        return dp.handle.plane.num_streams == 0 and await dp.leak_check() == (0, 0)

    await eventually(released, timeout=30, what="every disconnected request released")
    r = await client.completions.create(model=MODEL, prompt=IDS, max_tokens=4, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 4


async def test_a_non_streaming_client_that_leaves_aborts_its_request(dp, eventually):
    body = {"model": MODEL, "prompt": IDS, "max_tokens": 5000, "ignore_eos": True}
    async with httpx.AsyncClient() as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.post(_url(dp, "/v1/completions"), json=body, timeout=0.5)
    assert dp.handle.plane.num_streams <= 1

    async def released() -> bool:
        return dp.handle.plane.num_streams == 0 and await dp.leak_check() == (0, 0)

    await eventually(released, what="the abandoned request released")


async def test_a_repeated_prompt_reports_its_cached_tokens_on_both_apis_and_in_metrics(dp, client):
    rng = random.Random(3)
    prompt = [rng.randrange(1_000, 150_000) for _ in range(70)]  # 4 full blocks and 6 tokens
    first = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    second = await client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=2, temperature=0
    )
    assert second.usage.prompt_tokens_details.cached_tokens == 64  # the partial block is computed
    assert second.choices[0].text == first.choices[0].text
    _, final = await dp.generate(prompt, max_tokens=2)
    assert (final.usage.prompt_tokens, final.usage.cached_tokens) == (70, 64)
    async with httpx.AsyncClient() as http:
        metrics = (await http.get(_url(dp, "/metrics"))).text
    assert 'rimuru_prefix_cache_hits_total{model_name="tiny"} 128.0' in metrics
    assert "rimuru_prefix_cache_queries_total" in metrics
