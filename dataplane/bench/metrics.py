"""What a benchmark run measured: per-request and per-step records, and their summaries.

Request metrics follow vLLM's benchmark_serving: request throughput, output and total
tokens/s over the run's duration, and TTFT / TPOT / ITL / E2E latency mean, median and p99 in
milliseconds, with TPOT = (e2e - ttft) / (output_len - 1) over requests with output_len > 1.
Step metrics aggregate the engine's per-forward-step counters (concurrency, memory split,
expert traffic). All times are seconds since the start of the run (t = 0 before the first
request arrives); latencies are reported in ms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np


@dataclass(frozen=True)
class RequestRecord:
    """One finished request. `token_times` (one time per output token) is optional: without
    it, the request counts in every metric except ITL."""

    request_id: str
    arrival_time: float
    first_token_time: float
    last_token_time: float
    prompt_len: int
    output_len: int
    token_times: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.output_len < 1:
            raise ValueError(f"request {self.request_id}: output_len must be >= 1")
        if not self.arrival_time <= self.first_token_time <= self.last_token_time:
            raise ValueError(
                f"request {self.request_id}: need arrival_time <= first_token_time <= "
                f"last_token_time, got {self.arrival_time}, {self.first_token_time}, "
                f"{self.last_token_time}"
            )
        if self.token_times is not None:
            times = tuple(self.token_times)
            object.__setattr__(self, "token_times", times)
            if (
                len(times) != self.output_len
                or times[0] != self.first_token_time
                or times[-1] != self.last_token_time
                or any(b < a for a, b in pairwise(times))
            ):
                raise ValueError(
                    f"request {self.request_id}: token_times must hold output_len "
                    f"non-decreasing times from first_token_time to last_token_time; build "
                    f"the record with RequestRecord.from_token_times"
                )

    @classmethod
    def from_token_times(
        cls, request_id: str, arrival_time: float, prompt_len: int, token_times: Sequence[float]
    ) -> RequestRecord:
        if not token_times:
            raise ValueError(f"request {request_id}: a finished request has >= 1 token time")
        times = tuple(float(t) for t in token_times)
        return cls(request_id, arrival_time, times[0], times[-1], prompt_len, len(times), times)

    @property
    def ttft(self) -> float:
        return self.first_token_time - self.arrival_time

    @property
    def e2e_latency(self) -> float:
        return self.last_token_time - self.arrival_time

    @property
    def tpot(self) -> float | None:
        if self.output_len < 2:
            return None
        return (self.e2e_latency - self.ttft) / (self.output_len - 1)


@dataclass(frozen=True)
class LatencyStats:
    """Mean, median and p99 in ms over `count` samples; all 0.0 when count is 0 (as vLLM)."""

    count: int
    mean_ms: float
    median_ms: float
    p99_ms: float

    @classmethod
    def of_seconds(cls, samples: Sequence[float]) -> LatencyStats:
        if len(samples) == 0:
            return cls(0, 0.0, 0.0, 0.0)
        ms = np.asarray(samples, dtype=np.float64) * 1000.0
        return cls(len(ms), float(ms.mean()), float(np.median(ms)), float(np.percentile(ms, 99)))


@dataclass(frozen=True)
class RequestMetrics:
    num_completed: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float  # requests/s
    output_throughput: float  # output tokens/s
    total_token_throughput: float  # (input + output) tokens/s
    ttft: LatencyStats
    tpot: LatencyStats
    itl: LatencyStats
    e2e_latency: LatencyStats


def summarize_requests(records: Sequence[RequestRecord], duration_s: float) -> RequestMetrics:
    """vLLM's benchmark summary of the finished `records` of a run that lasted `duration_s`."""
    if not duration_s > 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    input_tokens = sum(r.prompt_len for r in records)
    output_tokens = sum(r.output_len for r in records)
    itls = [b - a for r in records if r.token_times is not None for a, b in pairwise(r.token_times)]
    return RequestMetrics(
        num_completed=len(records),
        duration_s=duration_s,
        total_input_tokens=input_tokens,
        total_output_tokens=output_tokens,
        request_throughput=len(records) / duration_s,
        output_throughput=output_tokens / duration_s,
        total_token_throughput=(input_tokens + output_tokens) / duration_s,
        ttft=LatencyStats.of_seconds([r.ttft for r in records]),
        tpot=LatencyStats.of_seconds([r.tpot for r in records if r.tpot is not None]),
        itl=LatencyStats.of_seconds(itls),
        e2e_latency=LatencyStats.of_seconds([r.e2e_latency for r in records]),
    )


@dataclass(frozen=True)
class StepRecord:
    """The engine's counters for one forward step (one record per step that ran the model).

    Gauges describe the state after scheduling the step; the counters marked "this step"
    are increments, not running totals. Bytes are the unified pool's split: kv_bytes +
    expert_bytes + cached_bytes + free_bytes = pool size.
    """

    step: int
    time: float
    num_running: int
    num_waiting: int
    num_kv_pages_used: int
    num_expert_pages_used: int
    kv_bytes: int
    expert_bytes: int
    free_bytes: int
    num_experts_resident: int  # routed experts in pool pages, all layers
    num_evictions: int  # experts moved to host this step
    num_loads: int  # experts brought into pool pages or loading buffers this step
    bytes_h2d: int  # host -> device bytes copied this step
    predictor_hits: int  # predicted experts that the router then chose, this step
    predictor_total: int  # experts the router chose on layers with a prediction, this step
    num_preemptions: int  # requests preempted this step
    # KV pages the prefix cache keeps for later requests (reclaimable; 0 before it existed)
    cached_bytes: int = 0


@dataclass(frozen=True)
class StepMetrics:
    """Summaries of a run's step records. None = not measured: a run with no step records
    (`rimuru bench --target`, through gRPC) has none of these, except the totals its server
    counters give (dataplane/bench/remote.py); a 0 would read as a measured zero."""

    forward_steps: int | None
    peak_running: int | None
    mean_running: float | None
    peak_waiting: int | None
    total_preemptions: int | None
    total_evictions: int | None
    total_loads: int | None
    total_bytes_h2d: int | None
    predictor_hit_rate: float | None  # also None when nothing was predicted
    peak_kv_bytes: int | None
    min_experts_resident: int | None
    max_experts_resident: int | None
    mean_experts_resident: float | None

    @classmethod
    def not_measured(cls, **totals: int) -> StepMetrics:
        """Every figure None but the given ones (e.g. total_loads from server counters)."""
        return cls(**{**dict.fromkeys(cls.__dataclass_fields__), **totals})


def summarize_steps(steps: Sequence[StepRecord]) -> StepMetrics:
    if not steps:
        return StepMetrics.not_measured()
    running = [s.num_running for s in steps]
    resident = [s.num_experts_resident for s in steps]
    predicted = sum(s.predictor_total for s in steps)
    return StepMetrics(
        forward_steps=len(steps),
        peak_running=max(running),
        mean_running=float(np.mean(running)),
        peak_waiting=max(s.num_waiting for s in steps),
        total_preemptions=sum(s.num_preemptions for s in steps),
        total_evictions=sum(s.num_evictions for s in steps),
        total_loads=sum(s.num_loads for s in steps),
        total_bytes_h2d=sum(s.bytes_h2d for s in steps),
        predictor_hit_rate=sum(s.predictor_hits for s in steps) / predicted if predicted else None,
        peak_kv_bytes=max(s.kv_bytes for s in steps),
        min_experts_resident=min(resident),
        max_experts_resident=max(resident),
        mean_experts_resident=float(np.mean(resident)),
    )
