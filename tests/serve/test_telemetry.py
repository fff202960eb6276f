"""OpenTelemetry metrics (exact counts), the Prometheus scrape endpoint, a span per request."""

from __future__ import annotations

import asyncio
import urllib.request

import grpc
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rimuru.dataplane.serve.plane.telemetry import PrometheusEndpoint
from rimuru.v1 import inference_pb2 as pb

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9] * 20]
MAX_TOKENS = 5


def _points(reader: InMemoryMetricReader) -> dict[str, list]:
    data = reader.get_metrics_data()
    return {
        metric.name: list(metric.data.data_points)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
    }


async def _run_requests(dp) -> None:
    await asyncio.gather(*(dp.generate(p, max_tokens=MAX_TOKENS, ignore_eos=True) for p in PROMPTS))


async def test_metrics_count_exactly_what_was_served(start_data_plane):
    reader = InMemoryMetricReader()
    dp = await start_data_plane(metric_readers=[reader])
    await _run_requests(dp)
    points = _points(reader)
    n = len(PROMPTS)

    def total(name: str) -> float:
        return sum(p.value for p in points[name])

    assert total("rimuru.generation_tokens") == n * MAX_TOKENS
    assert total("rimuru.prompt_tokens") == sum(len(p) for p in PROMPTS)
    (success,) = points["rimuru.request_success"]
    assert success.value == n and success.attributes["finished_reason"] == "length"
    for name in (
        "rimuru.time_to_first_token_seconds",
        "rimuru.e2e_request_latency_seconds",
        "rimuru.request_queue_time_seconds",
        "gen_ai.server.time_to_first_token",
        "gen_ai.server.time_per_output_token",
        "gen_ai.server.request.duration",
    ):
        (hist,) = points[name]
        assert hist.count == n, name
        assert hist.sum > 0 or name == "rimuru.request_queue_time_seconds", name
    (itl,) = points["rimuru.inter_token_latency_seconds"]
    assert itl.count == n * (MAX_TOKENS - 1)
    (genai,) = points["gen_ai.server.request.duration"]
    assert genai.attributes["gen_ai.request.model"] == "tiny"
    assert total("rimuru.num_requests_running") == 0
    assert total("rimuru.num_experts_resident") == 128
    assert total("rimuru.policy_version") == 0
    pool = {p.attributes["kind"]: p.value for p in points["rimuru.pool_pages"]}
    assert pool["expert"] == 384 and pool["kv"] == 0 and pool["free"] > 0
    for name in ("rimuru.expert_evictions", "rimuru.expert_loads", "rimuru.num_preemptions"):
        assert total(name) == 0, name


async def test_prometheus_endpoint_serves_the_metric_names(start_data_plane):
    endpoint = PrometheusEndpoint("127.0.0.1", 0)
    try:
        dp = await start_data_plane(metric_readers=[endpoint.reader])
        await _run_requests(dp)
        url = f"http://127.0.0.1:{endpoint.port}/metrics"
        text = await asyncio.to_thread(
            lambda: urllib.request.urlopen(url, timeout=5).read().decode()
        )
    finally:
        endpoint.close()
    for name in (
        "rimuru_num_requests_running",
        "rimuru_num_requests_waiting",
        "rimuru_kv_cache_usage_perc",
        "rimuru_time_to_first_token_seconds_bucket",
        "rimuru_inter_token_latency_seconds_bucket",
        "rimuru_e2e_request_latency_seconds_bucket",
        "rimuru_prompt_tokens_total",
        "rimuru_generation_tokens_total",
        "rimuru_num_preemptions_total",
        "gen_ai_server_time_to_first_token_seconds_bucket",
        "gen_ai_server_time_per_output_token_seconds_bucket",
        "gen_ai_server_request_duration_seconds_bucket",
        "rimuru_num_experts_resident",
        "rimuru_expert_evictions_total",
        "rimuru_expert_loads_total",
        "rimuru_host_to_device_bytes_total",
        "rimuru_predictor_hit_rate",
        "rimuru_pool_pages",
        "rimuru_pool_bytes",
        "rimuru_policy_version",
    ):
        assert f"\n{name}" in text, name
    assert (
        f'rimuru_generation_tokens_total{{model_name="tiny"}} {len(PROMPTS) * MAX_TOKENS}.0' in text
    )


async def test_one_span_per_request(start_data_plane):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    dp = await start_data_plane(tracer_provider=provider)
    await _run_requests(dp)
    spans = exporter.get_finished_spans()
    assert len(spans) == len(PROMPTS)
    assert {s.name for s in spans} == {"text_completion tiny"}
    assert sorted(s.attributes["gen_ai.usage.input_tokens"] for s in spans) == sorted(
        len(p) for p in PROMPTS
    )
    assert {s.attributes["gen_ai.usage.output_tokens"] for s in spans} == {MAX_TOKENS}
    assert {s.attributes["gen_ai.response.finish_reasons"] for s in spans} == {("length",)}


async def test_aborted_requests_are_counted_by_reason(start_data_plane, eventually):
    endpoint = PrometheusEndpoint("127.0.0.1", 0)
    try:
        dp = await start_data_plane(metric_readers=[endpoint.reader])
        long = pb.GenerateRequest(
            token_ids=pb.TokenIds(ids=[1, 2, 3]),
            sampling=pb.SamplingParams(max_tokens=1000, ignore_eos=True),
        )
        cancelled = [dp.stub.Generate(long) for _ in range(3)]
        for call in cancelled:
            assert (await call.read()).HasField("delta")  # in the engine, decoding
            call.cancel()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in dp.stub.Generate(long, timeout=0.3):
                pass
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await dp.generate([1, 2, 3], max_tokens=2, ignore_eos=True)  # finished: not counted
        url = f"http://127.0.0.1:{endpoint.port}/metrics"

        async def scrape() -> str:
            return await asyncio.to_thread(
                lambda: urllib.request.urlopen(url, timeout=5).read().decode()
            )

        async def counted() -> bool:
            text = await scrape()
            return all(
                f'rimuru_request_aborted_total{{model_name="tiny",reason="{reason}"}} {n}.0' in text
                for reason, n in (("cancelled", 3), ("deadline", 1))
            )

        await eventually(counted, what="three cancels and one deadline counted")
    finally:
        endpoint.close()


def test_a_metrics_port_in_use_is_refused_naming_the_flag():
    first = PrometheusEndpoint("127.0.0.1", 0)
    try:
        with pytest.raises(ValueError) as info:
            PrometheusEndpoint("127.0.0.1", first.port)
        assert str(info.value).startswith(
            f"cannot serve metrics on 127.0.0.1:{first.port} (--metrics-port): "
        )
        assert str(info.value).endswith("pick another port (0 = any free one)")
    finally:
        first.close()
