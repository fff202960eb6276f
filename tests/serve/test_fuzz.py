"""Fuzzed Generate requests: the status the contract promises, every time; server stays healthy.

The expected outcome comes from an oracle written from the proto's documentation, not from
the server's code. The server runs in a background thread with its own event loop, so
hypothesis drives it with plain blocking calls.
"""

from __future__ import annotations

import asyncio
import math
import threading

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.dataplane.serve.server import create_server
from rimuru.v1 import inference_pb2 as pb
from rimuru.v1 import inference_pb2_grpc as pb_grpc

VOCAB = 151936
MAX_MODEL_LEN = 64  # small, so the context check is easy to hit


class BackgroundServer:
    def __init__(self, config: EngineConfig) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.server, self.port, self.handle = self.run(create_server(config, "127.0.0.1:0"))
        self.run(self.server.start())
        self.run(self.handle.start())

    def run(self, coro, timeout: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.run(self.handle.shutdown(grace_s=0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


@pytest.fixture(scope="module")
def server():
    from dataclasses import replace

    from rimuru.policy import Tunables

    config = EngineConfig(
        memory_budget=160 * 2**20,
        activation_reserve=8 * 2**20,
        max_num_batched_tokens=256,
        max_model_len=MAX_MODEL_LEN,
        loading_buffer_slots=4,
        tunables=Tunables(mode="elastic", expert_offload_limit=4),
    )
    background = BackgroundServer(replace(config))
    yield background
    background.close()


@pytest.fixture(scope="module")
def channel(server):
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        yield ch


# Mostly plausible values with the edge cases mixed in, so that every rule gets exercised
# and a fair share of requests is valid (and runs: max_tokens stays small).
any_float = st.floats(allow_nan=True, allow_infinity=True, width=32)
sampling = st.fixed_dictionaries(
    {
        "max_tokens": st.one_of(
            st.integers(1, 4),
            st.integers(1, 4),
            st.integers(-5, 0),
            st.sampled_from([60, 2**31 - 1]),
        ),
    },
    optional={
        "temperature": st.one_of(st.floats(0, 2, width=32), any_float),
        "top_k": st.integers(-3, 200),
        "top_p": st.one_of(st.floats(0, 1, width=32), any_float),
        "seed": st.integers(0, 2**64 - 1),
        "stop_token_ids": st.lists(st.integers(-(2**31), 2**31 - 1), max_size=3),
        "ignore_eos": st.booleans(),
    },
)
valid_ids = st.lists(st.integers(0, VOCAB - 1), max_size=30)
any_ids = st.lists(
    st.one_of(st.integers(0, VOCAB - 1), st.integers(-(2**31), 2**31 - 1)), max_size=70
)
inputs = st.one_of(
    st.none(),
    valid_ids.map(lambda ids: ("token_ids", ids)),
    any_ids.map(lambda ids: ("token_ids", ids)),
    st.text(max_size=40).map(lambda text: ("text", text)),
)


def expected(input_, params: dict, prompt_len: int) -> tuple[grpc.StatusCode, str | None]:
    """(status, field the error must name) by the proto's contract."""
    bad = grpc.StatusCode.INVALID_ARGUMENT
    if input_ is None:
        return bad, "input"
    kind, value = input_
    if kind == "token_ids":
        if not value:
            return bad, "token_ids.ids"
        if any(not 0 <= t < VOCAB for t in value):
            return bad, "token_ids.ids["
    elif prompt_len == 0:
        return bad, "text"
    max_tokens = params.get("max_tokens", 64)
    if max_tokens < 1:
        return bad, "sampling.max_tokens"
    temperature = params.get("temperature", 0.0)
    if not math.isfinite(temperature) or temperature < 0:
        return bad, "sampling.temperature"
    if params.get("top_k", 0) < -1:
        return bad, "sampling.top_k"
    top_p = params.get("top_p", 1.0)
    if not 0.0 < top_p <= 1.0:
        return bad, "sampling.top_p"
    if any(t < 0 for t in params.get("stop_token_ids", ())):
        return bad, "sampling.stop_token_ids"
    if prompt_len + max_tokens > MAX_MODEL_LEN:
        return bad, "sampling.max_tokens"
    return grpc.StatusCode.OK, None


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(input_=inputs, params=sampling)
def test_fuzzed_requests_get_the_documented_status(channel, server, input_, params):
    stub = pb_grpc.InferenceStub(channel)
    request = pb.GenerateRequest(sampling=pb.SamplingParams(**params))
    prompt_len = 0
    if input_ is not None:
        kind, value = input_
        if kind == "token_ids":
            request.token_ids.ids.extend(value)
            prompt_len = len(value)
        else:
            request.text = value
            prompt_len = len(stub.Tokenize(pb.TokenizeRequest(text=value)).token_ids)
    # A float32 field holds the value rounded: judge what the server receives.
    received = {k: getattr(request.sampling, k) for k in params if k != "stop_token_ids"}
    received["stop_token_ids"] = list(request.sampling.stop_token_ids)
    want_code, want_field = expected(input_, received, prompt_len)
    try:
        responses = list(stub.Generate(request, timeout=30))
    except grpc.RpcError as exc:
        assert exc.code() == want_code, exc.details()
        assert exc.details().startswith(want_field), exc.details()
        return
    assert want_code == grpc.StatusCode.OK, f"accepted, but expected {want_code}"
    final = responses[-1].final
    tokens = [t for r in responses[:-1] for t in r.delta.token_ids]
    assert final.usage.completion_tokens == len(tokens) <= received.get("max_tokens", 64)
    assert final.finish_reason in (pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_STOP)
    if final.finish_reason == pb.FINISH_REASON_LENGTH:
        assert len(tokens) == received.get("max_tokens", 64)


def test_still_healthy_and_nothing_leaked_after_the_fuzzing(channel, server):
    health = health_pb2_grpc.HealthStub(channel)
    status = health.Check(health_pb2.HealthCheckRequest(), timeout=5).status
    assert status == health_pb2.HealthCheckResponse.SERVING

    def check(engine):
        engine.check_invariants()
        return engine.num_leaked_pages(), len(engine.requests)

    assert server.run(server.handle.call_engine(check)) == (0, 0)
