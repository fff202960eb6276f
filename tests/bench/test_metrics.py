"""Request and step summaries, checked against values worked out by hand."""

from __future__ import annotations

import pytest

from rimuru.dataplane.bench.metrics import (
    LatencyStats,
    RequestRecord,
    StepRecord,
    summarize_requests,
    summarize_steps,
)

approx = pytest.approx


def three_requests() -> list[RequestRecord]:
    return [
        # ttft 0.5, e2e 1.0, tpot (1.0 - 0.5) / 2 = 0.25, itl 0.2 and 0.3
        RequestRecord.from_token_times("a", 0.0, 10, [0.5, 0.7, 1.0]),
        # one token: ttft 0.25, no tpot, no itl
        RequestRecord.from_token_times("b", 1.0, 4, [1.25]),
        # (first, last, count) only: ttft 0.5, e2e 2.5, tpot 2.0 / 4 = 0.5, no itl
        RequestRecord("c", 2.0, 2.5, 4.5, prompt_len=6, output_len=5),
    ]


def step(i: int, running: int, waiting: int = 0, resident: int = 10, **counters) -> StepRecord:
    values = {
        "num_kv_pages_used": running * 2,
        "num_expert_pages_used": resident * 3,
        "kv_bytes": running * 2 * 100,
        "expert_bytes": resident * 300,
        "free_bytes": 10_000 - running * 200 - resident * 300,
        "num_evictions": 0,
        "num_loads": 0,
        "bytes_h2d": 0,
        "predictor_hits": 0,
        "predictor_total": 0,
        "num_preemptions": 0,
    }
    values.update(counters)
    return StepRecord(i, 0.1 * i, running, waiting, num_experts_resident=resident, **values)


def test_request_metrics_match_vllm_definitions():
    m = summarize_requests(three_requests(), duration_s=5.0)
    assert m.num_completed == 3
    assert (m.total_input_tokens, m.total_output_tokens) == (20, 9)
    assert m.request_throughput == approx(0.6)
    assert m.output_throughput == approx(1.8)
    assert m.total_token_throughput == approx(5.8)
    assert m.ttft == LatencyStats(3, approx(1250 / 3), approx(500.0), approx(500.0))
    # TPOT over a (250 ms) and c (500 ms); p99 interpolates linearly like numpy/vLLM.
    assert m.tpot == LatencyStats(2, approx(375.0), approx(375.0), approx(497.5))
    # ITL only from requests that carry token times.
    assert m.itl == LatencyStats(2, approx(250.0), approx(250.0), approx(299.0))
    assert m.e2e_latency == LatencyStats(3, approx(1250.0), approx(1000.0), approx(2470.0))


def test_no_samples_give_zero_stats_with_count_zero():
    m = summarize_requests([], duration_s=1.0)
    assert m.request_throughput == 0.0
    assert m.ttft == LatencyStats(0, 0.0, 0.0, 0.0)


def test_step_metrics_aggregate_counters():
    steps = [
        step(0, running=2, waiting=5, resident=12),
        step(1, running=6, waiting=1, resident=9, num_evictions=3, num_preemptions=1),
        step(
            2,
            running=4,
            resident=11,
            num_loads=2,
            bytes_h2d=600,
            predictor_hits=3,
            predictor_total=4,
        ),
        step(3, running=0, resident=11, predictor_hits=5, predictor_total=8),
    ]
    m = summarize_steps(steps)
    assert m.forward_steps == 4
    assert (m.peak_running, m.mean_running, m.peak_waiting) == (6, 3.0, 5)
    assert (m.total_evictions, m.total_loads, m.total_bytes_h2d) == (3, 2, 600)
    assert m.total_preemptions == 1
    assert m.predictor_hit_rate == approx(8 / 12)
    assert m.peak_kv_bytes == 1200
    assert (m.min_experts_resident, m.max_experts_resident) == (9, 12)
    assert m.mean_experts_resident == approx(10.75)
    assert summarize_steps([step(0, running=1)]).predictor_hit_rate is None
    none = summarize_steps([])  # not measured, not zero
    assert none.forward_steps is None and none.peak_running is None and none.total_loads is None


def test_inconsistent_records_are_refused():
    with pytest.raises(ValueError, match="arrival_time <= first_token_time"):
        RequestRecord("x", 2.0, 1.0, 3.0, prompt_len=4, output_len=2)
    with pytest.raises(ValueError, match="token_times must hold output_len"):
        RequestRecord("x", 0.0, 1.0, 2.0, 4, 3, token_times=(1.0, 2.0))
    with pytest.raises(ValueError, match="token_times must hold output_len"):
        RequestRecord("x", 0.0, 1.0, 2.0, 4, 3, token_times=(1.0, 2.5, 2.0))
    with pytest.raises(ValueError, match=r"has >= 1 token time"):
        RequestRecord.from_token_times("x", 0.0, 4, [])
    with pytest.raises(ValueError, match="duration_s must be > 0"):
        summarize_requests(three_requests(), duration_s=0.0)
