"""`rimuru bench --target host:port`: the benchmark through a running data plane's gRPC API.

Each trace request is sent at its scheduled arrival time as one Generate stream asking for
exactly its trace output length (`ignore_eos`, as in-process). Latencies are measured on the
client, from the scheduled arrival, so they include gRPC and the server's queue. The
server's policy and engine counters (evictions, loads, preemptions) come from EngineStats
before and after each run; per-step records exist only in-process, so the remote results
have no steps: their step summaries are None ("-" in the table, null in JSON) except the
totals the counters give (preemptions, evictions, loads, bytes copied in).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import sys
import time

import grpc

from rimuru.dataplane.bench.arrivals import arrival_times
from rimuru.dataplane.bench.goodput import find_max_rate, slo_section
from rimuru.dataplane.bench.metrics import RequestRecord, StepMetrics
from rimuru.dataplane.bench.plots import plot_rate_search
from rimuru.dataplane.bench.progress import RequestProgress
from rimuru.dataplane.bench.rate_search import RateSearch
from rimuru.dataplane.bench.results import BenchResult, output_dir, write_results
from rimuru.dataplane.bench.sampling import bench_params
from rimuru.dataplane.bench.slo import SLO
from rimuru.dataplane.bench.tables import format_table, print_slo_tables
from rimuru.dataplane.bench.trace import Trace
from rimuru.dataplane.serve.grpc_front.client import StreamResult, open_channel, stream_generate
from rimuru.v1 import inference_pb2 as pb
from rimuru.v1 import inference_pb2_grpc as pb_grpc

_COUNTERS = ("num_expert_evictions", "num_expert_loads", "num_preemptions", "bytes_host_to_device")


def run_remote(
    args: argparse.Namespace, trace: Trace, rates: list[float], slo: SLO | None = None
) -> int:
    """The trace at each rate, or with --find-max-rate the search (goodput.py) over the
    server's one policy: each rate is one `_run_all` call, as in-process each is one run."""

    out_dir = output_dir(args.output_dir)
    results: list[BenchResult] = []
    counters: list[dict[str, int]] = []
    searches: dict[str, RateSearch] = {}

    def run_at(rate: float) -> BenchResult:
        [result], [delta] = asyncio.run(_run_all(args, trace, [rate]))
        results.append(result)
        counters.append(delta)
        return result

    if args.find_max_rate:
        search = find_max_rate(
            run_at, slo, rates[0], args.rate_search_runs, args.rate_search_tolerance
        )
        searches[results[0].policy] = search
    else:
        for rate in rates:
            run_at(rate)
    section = slo_section(slo, results, searches) if slo is not None else None
    path = write_results(out_dir / "results.json", results, section)
    print(format_table(results))
    for result, delta in zip(results, counters, strict=True):
        print(
            f"server counters @ {result.request_rate:g} req/s: "
            + ", ".join(f"{k} {v}" for k, v in delta.items())
        )
    print_slo_tables(slo, results, searches)
    figures = []
    swept = [r for r in results if math.isfinite(r.request_rate)]
    if slo is not None and swept:
        figures.append(plot_rate_search(swept, slo, out_dir / "slo_rate_search.png"))
    print(f"\nresults: {path}" + (f"\nfigures: {figures[0]}" if figures else ""))
    return 0


async def _run_all(
    args: argparse.Namespace, trace: Trace, rates: list[float]
) -> tuple[list[BenchResult], list[dict[str, int]]]:
    results, counters = [], []
    async with open_target_channel(args) as channel:
        stub = pb_grpc.InferenceStub(channel)
        try:
            info = await stub.ModelInfo(pb.ModelInfoRequest(), timeout=30)
        except grpc.aio.AioRpcError as exc:
            raise ValueError(
                f"cannot reach the data plane at {args.target}: {exc.code().name} {exc.details()}"
            ) from None
        for rate in rates:
            before = await stub.EngineStats(pb.EngineStatsRequest(), timeout=30)
            arrivals = arrival_times(len(trace), rate, args.burstiness, args.seed).tolist()
            result = await _run_one(args, stub, trace, arrivals, rate, before.policy_mode)
            after = await stub.EngineStats(pb.EngineStatsRequest(), timeout=30)
            delta = {k: getattr(after, k) - getattr(before, k) for k in _COUNTERS}
            config = {
                "target": args.target,
                "model": info.model_name,
                "schedules_async": info.async_scheduling,  # the server's, resolved
                "policy_version": after.policy_version,
                "server_counters": delta,
            }
            built = BenchResult.build(before.policy_mode, rate, config, result[0], [], result[1])
            # No step records through gRPC: the totals come from the server's counters and
            # every per-step figure stays "not measured" (None, "-" in the table).
            measured = StepMetrics.not_measured(
                total_preemptions=delta["num_preemptions"],
                total_evictions=delta["num_expert_evictions"],
                total_loads=delta["num_expert_loads"],
                total_bytes_h2d=delta["bytes_host_to_device"],
            )
            results.append(dataclasses.replace(built, step_metrics=measured))
            counters.append(delta)
    return results, counters


async def _run_one(
    args: argparse.Namespace,
    stub: pb_grpc.InferenceStub,
    trace: Trace,
    arrivals: list[float],
    rate: float,
    policy: str,
) -> tuple[list[RequestRecord], float]:
    start = time.monotonic()
    finished = 0
    failures: list[StreamResult] = []

    async def one(i: int, at: float, bar: RequestProgress) -> StreamResult:
        nonlocal finished
        await asyncio.sleep(max(0.0, start + at - time.monotonic()))
        request = trace.requests[i]
        result = await stream_generate(
            stub,
            request.prompt_token_ids,
            bench_params(request.output_len, i, args.temperature),
            request_id=f"bench-{i}",
        )
        finished += 1
        bar.advance_to(finished)
        return result

    disable = None if not args.no_progress else True
    with RequestProgress(len(trace), desc=f"{policy} @ {rate:g} req/s", disable=disable) as bar:
        streams = await asyncio.gather(*(one(i, at, bar) for i, at in enumerate(arrivals)))
    duration = time.monotonic() - start
    records = []
    for i, (at, result) in enumerate(zip(arrivals, streams, strict=True)):
        if not result.ok or not result.token_times:
            failures.append(result)
            continue
        times = [t - start for t in result.token_times]
        records.append(
            RequestRecord.from_token_times(
                f"bench-{i}", min(at, times[0]), result.prompt_tokens, times
            )
        )
    if failures:
        first = failures[0]
        print(
            f"rimuru bench: {len(failures)} of {len(trace)} requests failed "
            f"(first: {first.status.name} {first.details})",
            file=sys.stderr,
        )
    if not records:
        raise ValueError("no request finished: see the errors above")
    return records, duration


def open_target_channel(args: argparse.Namespace) -> grpc.aio.Channel:
    """--target with --token-file and --tls-ca (a server with --api-token-file, --tls-cert)."""
    from rimuru.rpc import read_token

    token = read_token(args.token_file) if args.token_file else None
    from rimuru.rpc import read_root_certificates

    root_certificates = read_root_certificates(args.tls_ca, "--tls-ca") if args.tls_ca else None
    return open_channel(args.target, token=token, root_certificates=root_certificates)
