"""Drive the engine in-process with a trace and its arrival times; collect records.

Requests are added between steps once their scheduled arrival time has passed; latencies
are measured from the scheduled arrival (as a client sending on schedule would see them).
Each request asks for exactly its trace output length (`ignore_eos`, as vLLM's benchmark),
greedy unless a temperature is given (bench_params).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict

from rimuru.dataplane.bench.metrics import RequestRecord, StepRecord
from rimuru.dataplane.bench.progress import RequestProgress
from rimuru.dataplane.bench.results import BenchResult
from rimuru.dataplane.bench.sampling import bench_params
from rimuru.dataplane.bench.trace import Trace
from rimuru.dataplane.engine.engine import Engine, StepStats

log = logging.getLogger(__name__)


def run_trace(
    engine: Engine,
    trace: Trace,
    arrivals: list[float],
    request_rate: float,
    progress: bool = True,
    desc: str = "",
    clock: Callable[[], float] = time.monotonic,
    temperature: float = 0.0,
    max_concurrency: int | None = None,
) -> BenchResult:
    """max_concurrency: at most this many requests in flight, as a client's semaphore
    (vLLM's `bench serve --max-concurrency`, guidellm's concurrency cap): a request that
    arrives with the cap full is sent once one finishes, and its latencies count from then,
    as such a client measures them."""
    if len(arrivals) != len(trace):
        raise ValueError("one arrival time per request")
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"--max-concurrency must be at least 1; got {max_concurrency}")
    start = clock()
    pending = list(zip(arrivals, trace.requests, strict=True))
    ids: list[str] = []
    finished = 0  # of ids, counted as they finish
    held = False  # the cap kept arrived requests back: the next is sent on a freed slot
    first_step = engine.step_id
    resident_at_start = engine.residency.num_resident()  # the first step may already evict
    with RequestProgress(
        len(trace), desc=desc or engine.tunables.mode, disable=None if progress else True
    ) as bar:
        while pending or engine.has_unfinished_requests():
            now = clock() - start
            while pending and pending[0][0] <= now:
                if max_concurrency is not None and len(ids) - finished >= max_concurrency:
                    held = True
                    break
                at, request = pending.pop(0)
                ids.append(
                    engine.add_request(
                        list(request.prompt_token_ids),
                        bench_params(request.output_len, len(ids), temperature),
                        request_id=f"{engine.tunables.mode}-{len(ids)}",
                        arrival_time=start + (max(at, now) if held else at),
                    )
                )
            else:
                held = False
            if not engine.has_unfinished_requests():
                time.sleep(max(0.0, min(pending[0][0] - now, 0.05)))
                continue
            engine.step()
            done = finished = sum(1 for i in ids if engine.requests[i].status.finished)
            bar.advance_to(
                done, running=len(engine.scheduler.running), waiting=len(engine.scheduler.waiting)
            )
    return collect_result(
        engine, ids, start, clock() - start, first_step, resident_at_start, request_rate
    )


def collect_result(
    engine: Engine,
    ids: list[str],
    start: float,
    duration: float,
    first_step: int,
    resident_at_start: int,
    request_rate: float,
    **extra_config,
) -> BenchResult:
    """A finished run's records: its requests `ids`, the steps after `first_step`, and the
    engine's config (with `extra_config`, what the driver adds) for the results file."""
    requests = [_request_record(engine, i, start) for i in ids]
    baseline, kept = engine.stats.at(first_step), engine.stats.since(first_step)
    dropped = engine.stats.dropped_since(first_step)
    if dropped and kept:  # counters are cumulative: the oldest kept record is the baseline
        baseline, kept = kept[0], kept[1:]
        log.warning(
            "the run's first %d steps fell out of the engine's step log (%d records kept): "
            "the per-step records and plots cover its last %d steps",
            dropped + 1, engine.stats.window, len(kept),
        )  # fmt: skip
    steps = _step_records(kept, baseline, start)
    config = {
        k: (v if not hasattr(v, "to_dict") else v.to_dict())
        for k, v in asdict(engine.config).items()
    }
    config["memory_plan"] = asdict(engine.plan)
    config["schedules_async"] = engine.config.schedules_async  # async_scheduling resolved
    config["experts_resident_at_start"] = resident_at_start
    config.update(extra_config)
    return BenchResult.build(engine.tunables.mode, request_rate, config, requests, steps, duration)


def _request_record(engine: Engine, request_id: str, start: float) -> RequestRecord:
    r = engine.requests[request_id]
    times = tuple(t - start for t in r.token_times)
    return RequestRecord.from_token_times(
        request_id, r.arrival_time - start, len(r.prompt_token_ids), times
    )


def _step_records(
    stats: list[StepStats], baseline: StepStats | None, start: float
) -> list[StepRecord]:
    """Engine counters are cumulative; records hold per-step increments. Only steps that
    ran a forward count (idle rounds still carry their counters into the next record)."""
    records = []
    prev = baseline
    for s in stats:
        if s.num_scheduled_tokens > 0:

            def inc(name: str, s=s, prev=prev) -> int:
                return getattr(s, name) - (getattr(prev, name) if prev is not None else 0)

            records.append(
                StepRecord(
                    step=s.step,
                    time=s.time - start,
                    num_running=s.num_running,
                    num_waiting=s.num_waiting,
                    num_kv_pages_used=s.num_kv_pages_used,
                    num_expert_pages_used=s.num_expert_pages_used,
                    kv_bytes=s.kv_bytes,
                    expert_bytes=s.expert_bytes,
                    free_bytes=s.num_free_bytes - s.cached_bytes,
                    num_experts_resident=s.num_experts_resident,
                    num_evictions=inc("evictions"),
                    num_loads=inc("loads") + inc("buffer_copies"),
                    bytes_h2d=inc("bytes_h2d"),
                    predictor_hits=inc("predictor_hits"),
                    predictor_total=inc("predictor_needed"),
                    num_preemptions=inc("preemptions"),
                    cached_bytes=s.cached_bytes,
                )
            )
            prev = s
    return records
