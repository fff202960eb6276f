"""`rimuru bench`: the three memory policies on the same request stream and budget.

Default (no flags): the CPU setup of the README's quick start — `tiny` preset, the bundled
ShareGPT slice, a budget small enough that memory is the bottleneck, all requests at once.
"""

from __future__ import annotations

import argparse
import gc
import logging
import math
import time
from dataclasses import replace
from pathlib import Path

from rimuru.cli_args import positive_int, target
from rimuru.dataplane.bench.arrivals import arrival_times, parse_request_rate
from rimuru.dataplane.bench.goodput import (
    find_max_rate,
    slo_section,
)
from rimuru.dataplane.bench.plots import plot_memory_split, plot_rate_search, plot_rate_sweep
from rimuru.dataplane.bench.rate_search import RateSearch
from rimuru.dataplane.bench.results import BenchResult, output_dir, write_results
from rimuru.dataplane.bench.sampling import bench_params
from rimuru.dataplane.bench.slo import SLO, parse_slo
from rimuru.dataplane.bench.tables import format_table, print_slo_tables
from rimuru.dataplane.bench.trace import check_trace_fits_model, load_trace
from rimuru.dataplane.engine.flags import add_engine_arguments, engine_config_from_args
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.policy import MODES, parse_modes

DEFAULT_NUM_PROMPTS = 200  # the bundled CPU trace's size
# The quick start's setup of the bundled trace, where bench's defaults differ from the
# engine's (every other command's): at CPU_DEFAULT_BUDGET the activations leave room for
# steps of 1024 tokens only (the engine's 2048 do not fit beside the experts), and the
# trace's burst moves the boundary only when 16 experts per layer may be offloaded (at the
# engine's 8 elastic evicts nothing). Pass the flags to benchmark any other setup.
BENCH_DEFAULTS = {"max_num_batched_tokens": 1024, "expert_offload_limit": 16}
CPU_DEFAULT_BUDGET = (
    "304MiB"  # tiny: ~75 MiB non-pool weights + ~198 MiB activations; experts 24 MiB
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    # The engine's flags, but --policies for --mode: bench runs each policy in turn.
    add_engine_arguments(p, skip=("mode",), defaults=BENCH_DEFAULTS)
    p.add_argument(
        "--policies",
        default=",".join(MODES),
        help="comma-separated subset of resident,fixed,elastic",
    )
    p.add_argument("--trace", default="sharegpt_qwen_cpu", help="bundled trace name or .npz path")
    p.add_argument(
        "--num-prompts",
        type=positive_int,
        default=None,
        help=f"first N requests of the trace (default: {DEFAULT_NUM_PROMPTS}, or all of a "
        f"smaller trace); more than the trace has is refused",
    )
    p.add_argument(
        "--request-rate",
        default=None,
        help="requests/s, comma-separated for a sweep; inf = all at once (the default); "
        "with --find-max-rate, the one rate the search starts at (default 1)",
    )
    p.add_argument(
        "--slo",
        default=None,
        help="latency SLO, e.g. ttft_p99=2s,tpot_p99=100ms (vLLM's --goodput metrics; "
        "p50|p90|p95|p99, s or ms): adds each run's goodput and whether it meets the SLO",
    )
    p.add_argument(
        "--find-max-rate",
        action="store_true",
        help="search each policy's highest request rate meeting --slo (doubling, then "
        "bisection), one engine per policy",
    )
    p.add_argument(
        "--rate-search-runs",
        type=positive_int,
        default=8,
        help="most runs (rates) the search makes per policy",
    )
    p.add_argument(
        "--rate-search-tolerance",
        type=float,
        default=0.1,
        help="the search stops once first failing rate / max rate <= 1 + this",
    )
    p.add_argument(
        "--system-prompt-tokens",
        type=int,
        default=0,
        help="put the same N-token system prompt (the trace's first prompt tokens) before "
        "every prompt: the shared-prefix load prefix caching serves",
    )
    p.add_argument(
        "--max-concurrency",
        type=positive_int,
        default=None,
        help="at most N requests in flight, as vLLM's bench serve: one that arrives with N "
        "in flight is sent when one finishes, its latencies counted from then",
    )
    p.add_argument(
        "--multi-turn",
        type=int,
        default=0,
        metavar="TURNS",
        help="chat: conversations of TURNS consecutive requests, each turn resending the "
        "history with the model's answers, sent as a closed loop (conversations.py)",
    )
    p.add_argument(
        "--num-clients",
        type=positive_int,
        default=16,
        help="--multi-turn: conversations at once",
    )
    p.add_argument(
        "--burstiness", type=float, default=1.0, help="gamma shape of arrival gaps (1 = Poisson)"
    )
    p.add_argument(
        "--profile-prompts",
        type=positive_int,
        default=32,
        help="first N prompts profile the hotness ranking (without --hotness)",
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="sampling temperature of every request (0 = greedy; above 0 each request is "
        "seeded by its index in the trace)",
    )
    p.add_argument("--output-dir", default="out/bench")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--threads",
        type=positive_int,
        default=1,
        help="torch CPU threads (tiny models gain nothing from more)",
    )
    p.add_argument(
        "--target",
        type=target,
        default=None,
        help="host:port of a data plane: benchmark through gRPC",
    )
    p.add_argument(
        "--token-file",
        default=None,
        help="--target: bearer token file (rimuru serve --api-token-file)",
    )
    p.add_argument("--tls-ca", default=None, help="--target: PEM root certificate: talk TLS")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import torch

    from rimuru.dataplane.parallel.launch import engine_builder

    policies = parse_modes(args.policies)
    slo = parse_slo(args.slo) if args.slo is not None else None
    rates = _rates(args, slo)
    bench_params(1, 0, args.temperature)  # a bad --temperature is refused before any run
    # The bundled trace on the CPU needs a budget small enough that memory is the
    # bottleneck (the quick start); any other run says its own budget.
    if args.memory_budget is None and args.gpu_memory_utilization is None and args.device == "cpu":
        args.memory_budget = CPU_DEFAULT_BUDGET
    # refused now, not after the first policies ran
    base = same_scheduling(engine_config_from_args(args, mode=policies[0]), policies)
    for policy in policies[1:]:
        base.with_mode(policy)
    trace = load_trace(args.trace)
    # Asked for more than the trace has: refused, not silently fewer (profile-hotness agrees).
    trace = trace.head(args.num_prompts or min(DEFAULT_NUM_PROMPTS, len(trace)))
    trace = trace.with_system_prompt(args.system_prompt_tokens)
    if args.multi_turn:
        _check_multi_turn(args, trace)
    if args.max_concurrency is not None and (args.target or args.multi_turn):
        raise ValueError(
            "--max-concurrency caps an in-process open-loop run: not with --target or "
            "--multi-turn (--num-clients caps a closed loop)"
        )
    # Drawn before any engine is built, so a bad --burstiness is refused at once.
    for rate in rates:
        arrival_times(len(trace), rate, args.burstiness, args.seed)
    if args.target:
        from rimuru.dataplane.bench.remote import run_remote

        return run_remote(args, trace, rates, slo)
    check_trace_fits_model(trace, args.model)
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    with engine_builder(base, threads=args.threads) as build:
        return _run_local(args, build, base, trace, rates, slo, policies)


def same_scheduling(base: EngineConfig, policies: list[str]) -> EngineConfig:
    """`base` with async scheduling resolved once for every policy compared: auto would
    turn it on for resident and off for fixed and elastic with host copies, and the table
    would compare scheduling, not policies. On only where every policy can have it."""
    if base.async_scheduling is not None:
        return base
    each = {p: base.with_mode(p).schedules_async for p in policies}
    if len(set(each.values())) > 1:
        off = ", ".join(p for p, on in each.items() if not on)
        logging.warning("async scheduling: off for every policy (%s cannot have it here)", off)
    return replace(base, async_scheduling=all(each.values()))


def _run_local(args, build, base, trace, rates, slo, policies) -> int:
    """Each policy's engine here (with -tp, rank 0 of workers that follow it)."""
    out_dir = output_dir(args.output_dir)
    ranking = None
    results: list[BenchResult] = []
    searches: dict[str, RateSearch] = {}
    for policy in policies:
        engine = build(base.with_mode(policy))
        try:
            ranking = _bench_policy(
                args, engine, policy, trace, rates, slo, ranking, results, searches
            )
        finally:
            engine.close()
        # Dropped before the next policy's engine is built: two engines at once hold two
        # copies of every weight (on a 128 GiB host, two pinned copies of qwen3-30b's
        # experts were killed for memory).
        del engine
        release_memory(base.device)
    path = write_results(out_dir / "results.json", results, _slo_section(slo, results, searches))
    swept = [r for r in results if math.isfinite(r.request_rate)]
    figures = []
    if not args.find_max_rate:
        last = [r for r in results if r.request_rate == rates[-1]]
        figures.append(plot_memory_split(last, out_dir / "fig4_memory_split.png"))
    if len({r.request_rate for r in swept}) > 1 and len(swept) == len(results):
        figures.append(plot_rate_sweep(results, out_dir / "fig9_rate_sweep.png"))
    if slo is not None and swept:
        figures.append(plot_rate_search(swept, slo, out_dir / "slo_rate_search.png"))
    print(format_table(results))
    print_slo_tables(slo, results, searches)
    print(f"\nresults: {path}\nfigures: {', '.join(str(f) for f in figures)}")
    return 0


def release_memory(device) -> None:
    """What a dropped engine held goes back: its tensors now (cycles in the model and its
    graphs keep them otherwise), the device's cached blocks to the driver."""
    import torch

    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def _bench_policy(args, engine, policy: str, trace, rates, slo, ranking, results, searches):
    """One policy's runs on its engine, appended to `results` (and `searches`); returns the
    hotness ranking, profiled on the first policy's engine and shared by the rest."""
    from rimuru.dataplane.engine.hotness_profile import profile_hotness

    out_dir = Path(args.output_dir)
    if ranking is None and args.hotness is None:
        started = time.monotonic()
        sample = [list(r.prompt_token_ids) for r in trace.requests[: args.profile_prompts]]
        ranking = profile_hotness(
            engine, sample, source=f"{args.trace}: first {len(sample)} prompts"
        )
        ranking.save(out_dir / "hotness.json")
        logging.info(
            "hotness profiled on %d prompts in %.1fs", len(sample), time.monotonic() - started
        )
    if ranking is not None:
        engine.set_ranking(ranking)
    policy_runs = len(results)

    def run_at(rate: float, engine=engine, policy=policy, first=policy_runs) -> BenchResult:
        if len(results) > first:  # the last rate's evictions must not carry over
            engine.reset_residency()
        if args.multi_turn:
            result = run_conversations(
                engine,
                conversations_of(trace, args.multi_turn),
                args.num_clients,
                progress=not args.no_progress,
                desc=f"{policy}, {args.num_clients} chats",
                temperature=args.temperature,
            )
        else:
            arrivals = arrival_times(len(trace), rate, args.burstiness, args.seed).tolist()
            result = run_trace(
                engine,
                trace,
                arrivals,
                rate,
                progress=not args.no_progress,
                desc=f"{policy} @ {rate:g} req/s",
                temperature=args.temperature,
                max_concurrency=args.max_concurrency,
            )
        engine.check_invariants()
        if engine.num_leaked_pages():
            raise RuntimeError(f"{policy}: {engine.num_leaked_pages()} KV pages leaked")
        results.append(result)
        # after every run: partial results survive
        write_results(out_dir / "results.json", results, _slo_section(slo, results, searches))
        return result

    if args.find_max_rate:
        searches[policy] = find_max_rate(
            run_at, slo, rates[0], args.rate_search_runs, args.rate_search_tolerance
        )
    else:
        for rate in rates:
            run_at(rate)
    return ranking


def _rates(args: argparse.Namespace, slo: SLO | None) -> list[float]:
    """The rates to run, or with --find-max-rate the one the search starts at."""
    if not args.find_max_rate:
        return [parse_request_rate(r) for r in str(args.request_rate or "inf").split(",")]
    if slo is None:
        raise ValueError("--find-max-rate needs --slo, e.g. --slo ttft_p99=2s,tpot_p99=100ms")
    start = (
        math.inf if "," in str(args.request_rate) else parse_request_rate(args.request_rate or "1")
    )
    if not math.isfinite(start):
        raise ValueError(
            f"--find-max-rate starts from one finite --request-rate, got {args.request_rate!r}"
        )
    if not args.rate_search_tolerance > 0:
        raise ValueError(f"--rate-search-tolerance must be > 0, got {args.rate_search_tolerance}")
    return [start]


def _check_multi_turn(args: argparse.Namespace, trace) -> None:
    """A closed loop sets its own pace: no rates, no rate search, in-process only."""
    if args.request_rate is not None or args.find_max_rate or args.target:
        raise ValueError(
            "--multi-turn sends each turn when the last answer is complete: drop "
            "--request-rate, --find-max-rate and --target"
        )
    conversations_of(trace, args.multi_turn)  # too few requests or turns: refused now


def _slo_section(slo: SLO | None, results, searches) -> dict | None:
    return slo_section(slo, results, searches) if slo is not None else None


def run_conversations(*args, **kwargs):
    from rimuru.dataplane.bench.conversations import run_conversations as _run

    return _run(*args, **kwargs)


def conversations_of(*args, **kwargs):
    from rimuru.dataplane.bench.conversations import conversations_of as _of

    return _of(*args, **kwargs)


def run_trace(*args, **kwargs):
    from rimuru.dataplane.bench.runner import run_trace as _run_trace

    return _run_trace(*args, **kwargs)
