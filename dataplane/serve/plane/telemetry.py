"""OpenTelemetry metrics and traces of a data plane, and its Prometheus scrape endpoint.

Names (Prometheus spelling; OpenTelemetry's dots become underscores, counters get _total):

  as vLLM (prefix rimuru_ instead of vllm:)      GenAI semantic conventions
    rimuru_num_requests_running                    gen_ai_server_time_to_first_token_seconds
    rimuru_num_requests_waiting                    gen_ai_server_time_per_output_token_seconds
    rimuru_kv_cache_usage_perc                     gen_ai_server_request_duration_seconds
    rimuru_time_to_first_token_seconds
    rimuru_inter_token_latency_seconds           Rimuru's own
    rimuru_e2e_request_latency_seconds             rimuru_num_experts_resident
    rimuru_request_queue_time_seconds              rimuru_expert_evictions_total
    rimuru_prompt_tokens_total                     rimuru_expert_loads_total
    rimuru_generation_tokens_total                 rimuru_host_to_device_bytes_total
    rimuru_request_success_total{finished_reason}  rimuru_predictor_hit_rate
    rimuru_num_preemptions_total                   rimuru_pool_pages{kind=kv|expert|free}
    rimuru_prefix_cache_queries_total
    rimuru_prefix_cache_hits_total
                                                   rimuru_pool_bytes{kind=kv|expert}
                                                   rimuru_policy_version
                                                   rimuru_request_aborted_total{reason=
                                                     cancelled|deadline|shutdown}

Gauges and engine counters are read from the engine thread's latest snapshot at scrape
time; request histograms are recorded when a request finishes.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import pairwise

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader

from rimuru.dataplane.serve.plane.events import EngineSnapshot, FinishedEvent
from rimuru.dataplane.serve.plane.observer import Observer

# Bucket boundaries (seconds). GenAI ones are the semantic conventions' advisory buckets.
_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)  # fmt: skip
_GENAI_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                       1.0, 2.5, 5.0, 7.5, 10.0)  # fmt: skip
_GENAI_TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
_GENAI_DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24,
                           20.48, 40.96, 81.92)  # fmt: skip


class ServeMetrics(Observer):
    """The data plane's instruments on one MeterProvider (its readers decide the export)."""

    def __init__(self, readers: Iterable[MetricReader] = ()) -> None:
        self.provider = MeterProvider(metric_readers=list(readers))
        self._snapshot: EngineSnapshot | None = None
        self._model = ""
        meter = self.provider.get_meter("rimuru.serve")

        def histogram(name: str, description: str, buckets: tuple[float, ...]):
            return meter.create_histogram(
                name, unit="s", description=description, explicit_bucket_boundaries_advisory=buckets
            )

        self._ttft = histogram(
            "rimuru.time_to_first_token_seconds", "Arrival to first token.", _LATENCY_BUCKETS
        )
        self._itl = histogram(
            "rimuru.inter_token_latency_seconds", "Time between two tokens.", _LATENCY_BUCKETS
        )
        self._e2e = histogram(
            "rimuru.e2e_request_latency_seconds", "Arrival to last token.", _LATENCY_BUCKETS
        )
        self._queue = histogram(
            "rimuru.request_queue_time_seconds", "Arrival to first schedule.", _LATENCY_BUCKETS
        )
        self._genai_ttft = histogram(
            "gen_ai.server.time_to_first_token",
            "Time to generate the first token.",
            _GENAI_TTFT_BUCKETS,
        )
        self._genai_tpot = histogram(
            "gen_ai.server.time_per_output_token",
            "Time per output token after the first one.",
            _GENAI_TPOT_BUCKETS,
        )
        self._genai_duration = histogram(
            "gen_ai.server.request.duration", "Time to last token.", _GENAI_DURATION_BUCKETS
        )
        self._prompt_tokens = meter.create_counter(
            "rimuru.prompt_tokens", unit="{token}", description="Prefilled prompt tokens."
        )
        self._generation_tokens = meter.create_counter(
            "rimuru.generation_tokens", unit="{token}", description="Generated tokens."
        )
        self._success = meter.create_counter(
            "rimuru.request_success", unit="{request}", description="Finished requests."
        )
        self._aborted = meter.create_counter(
            "rimuru.request_aborted",
            unit="{request}",
            description="Requests aborted before they finished, by reason.",
        )
        gauges = {
            "rimuru.num_requests_running": ("Requests in the running batch.", "{request}"),
            "rimuru.num_requests_waiting": ("Requests waiting to be scheduled.", "{request}"),
            "rimuru.kv_cache_usage_perc": ("Fraction of KV pages in use (0-1).", "1"),
            "rimuru.num_experts_resident": ("Experts in pool pages, all layers.", "{expert}"),
            "rimuru.predictor_hit_rate": ("Non-resident experts found prefetched (0-1).", "1"),
            "rimuru.pool_pages": ("Pool pages by use (KV or expert page units).", "{page}"),
            "rimuru.pool_bytes": ("Pool bytes held by KV pages and by experts.", "By"),
            "rimuru.policy_version": ("Control-plane policy version applied (0 = flags).", "1"),
        }
        for name, (description, unit) in gauges.items():
            meter.create_observable_gauge(
                name, callbacks=[self._observer_of(name)], unit=unit, description=description
            )
        counters = {
            "rimuru.num_preemptions": ("Requests preempted (KV pages taken back).", "{request}"),
            "rimuru.expert_evictions": ("Experts evicted to host memory.", "{expert}"),
            "rimuru.expert_loads": ("Experts loaded back into pool pages.", "{expert}"),
            "rimuru.host_to_device": ("Bytes copied host to device for experts.", "By"),
            "rimuru.prefix_cache_queries": (
                "Prompt tokens looked up in the prefix cache.",
                "{token}",
            ),
            "rimuru.prefix_cache_hits": ("Prompt tokens found in the prefix cache.", "{token}"),
        }
        for name, (description, unit) in counters.items():
            meter.create_observable_counter(
                name, callbacks=[self._observer_of(name)], unit=unit, description=description
            )

    def set_model(self, model_name: str) -> None:
        self._model = model_name

    # ---------------------------------------------------------------- Observer (engine thread)
    def on_scheduled(self, prompt_tokens: int, queue_seconds: float) -> None:
        self._prompt_tokens.add(prompt_tokens, {"model_name": self._model})
        self._queue.record(queue_seconds, {"model_name": self._model})

    def on_tokens(self, num_tokens: int) -> None:
        if num_tokens:
            self._generation_tokens.add(num_tokens, {"model_name": self._model})

    def on_finished(self, event: FinishedEvent, token_times: tuple[float, ...]) -> None:
        vllm = {"model_name": self._model}
        genai = {"gen_ai.operation.name": "text_completion", "gen_ai.request.model": self._model}
        t = event.timing
        self._success.add(1, {**vllm, "finished_reason": event.finish_reason})
        self._ttft.record(t.time_to_first_token_seconds, vllm)
        self._e2e.record(t.e2e_seconds, vllm)
        for a, b in pairwise(token_times):
            self._itl.record(b - a, vllm)
        self._genai_ttft.record(t.time_to_first_token_seconds, genai)
        self._genai_duration.record(t.e2e_seconds, genai)
        if event.usage.completion_tokens > 1:
            self._genai_tpot.record(t.mean_inter_token_seconds, genai)

    def on_aborted(self, reason: str) -> None:
        self._aborted.add(1, {"model_name": self._model, "reason": reason})

    def on_snapshot(self, snapshot: EngineSnapshot) -> None:
        self._snapshot = snapshot  # one reference swap: scrapes see a whole snapshot

    # ---------------------------------------------------------------- scrape time
    def _observer_of(self, name: str):
        def observe(_options: CallbackOptions) -> list[Observation]:
            s = self._snapshot
            return [] if s is None else list(_observations(name, s, self._model))

        return observe

    def shutdown(self) -> None:
        self.provider.shutdown()


def _observations(name: str, s: EngineSnapshot, model: str) -> Iterable[Observation]:
    labels = {"model_name": model}
    simple = {
        "rimuru.num_requests_running": s.num_requests_running,
        "rimuru.num_requests_waiting": s.num_requests_waiting,
        "rimuru.kv_cache_usage_perc": s.kv_cache_usage_perc,
        "rimuru.num_experts_resident": sum(s.num_experts_resident),
        "rimuru.predictor_hit_rate": s.predictor_hit_rate,
        "rimuru.policy_version": s.policy_version,
        "rimuru.num_preemptions": s.num_preemptions,
        "rimuru.expert_evictions": s.num_expert_evictions,
        "rimuru.expert_loads": s.num_expert_loads,
        "rimuru.host_to_device": s.bytes_host_to_device,
        "rimuru.prefix_cache_queries": s.prefix_cache_queries,
        "rimuru.prefix_cache_hits": s.prefix_cache_hits,
    }
    if name in simple:
        yield Observation(simple[name], labels)
    elif name == "rimuru.pool_pages":
        yield Observation(s.num_kv_pages, {**labels, "kind": "kv"})
        yield Observation(s.num_expert_pages, {**labels, "kind": "expert"})
        yield Observation(s.num_free_pages, {**labels, "kind": "free"})
    elif name == "rimuru.pool_bytes":
        yield Observation(s.kv_pool_bytes, {**labels, "kind": "kv"})
        yield Observation(s.expert_pool_bytes, {**labels, "kind": "expert"})


def prometheus_reader():
    """(reader for ServeMetrics, the prometheus_client registry it fills at scrape time)."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    reader = PrometheusMetricReader(
        disable_target_info=True, scope_info_enabled=False, registry=registry
    )
    return reader, registry


class PrometheusEndpoint:
    """`GET /metrics` on host:port (0 = any free port) from this server's own registry."""

    def __init__(self, host: str, port: int) -> None:
        from prometheus_client import start_http_server

        self.reader, self.registry = prometheus_reader()
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise ValueError(
                f"cannot serve metrics on {host}:{port} (--metrics-port): {exc.strerror}; pick "
                f"another port (0 = any free one)"
            ) from exc
        self.port = self._server.server_port

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
