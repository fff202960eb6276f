"""`rimuru bench`: the three memory policies on the same request stream and budget.

Default (no flags): the CPU setup of the README's quick start — `tiny` preset, the bundled
ShareGPT slice, a budget small enough that memory is the bottleneck, all requests at once.
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from pathlib import Path

from rimuru.cli_args import positive_int
from rimuru.dataplane.bench.arrivals import arrival_times, parse_request_rate
from rimuru.dataplane.bench.plots import plot_memory_split, plot_rate_sweep
from rimuru.dataplane.bench.results import BenchResult, write_results
from rimuru.dataplane.bench.trace import check_trace_fits_model, load_trace
from rimuru.dataplane.engine.flags import add_engine_arguments, engine_config_from_args
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
        default="inf",
        help="requests/s, comma-separated for a sweep; inf = all at once",
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
    p.add_argument("--output-dir", default="out/bench")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--threads",
        type=positive_int,
        default=1,
        help="torch CPU threads (tiny models gain nothing from more)",
    )
    p.add_argument(
        "--target", default=None, help="host:port of a data plane: benchmark through gRPC"
    )


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import torch

    from rimuru.dataplane.engine.engine import Engine
    from rimuru.dataplane.engine.hotness_profile import profile_hotness

    policies = parse_modes(args.policies)
    rates = [parse_request_rate(r) for r in str(args.request_rate).split(",")]
    # The bundled trace on the CPU needs a budget small enough that memory is the
    # bottleneck (the quick start); any other run says its own budget.
    if args.memory_budget is None and args.gpu_memory_utilization is None and args.device == "cpu":
        args.memory_budget = CPU_DEFAULT_BUDGET
    base = engine_config_from_args(args)  # refused now, not after the first policies ran
    trace = load_trace(args.trace)
    # Asked for more than the trace has: refused, not silently fewer (profile-hotness agrees).
    trace = trace.head(args.num_prompts or min(DEFAULT_NUM_PROMPTS, len(trace)))
    # Drawn before any engine is built, so a bad --burstiness is refused at once.
    arrivals_per_rate = [
        arrival_times(len(trace), rate, args.burstiness, args.seed).tolist() for rate in rates
    ]
    if args.target:
        from rimuru.dataplane.bench.remote import run_remote

        return run_remote(args, trace, rates)
    check_trace_fits_model(trace, args.model)
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ranking = None
    results: list[BenchResult] = []
    for policy in policies:
        engine = Engine(base.with_mode(policy))
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
        for i, (rate, arrivals) in enumerate(zip(rates, arrivals_per_rate, strict=True)):
            if i:  # the last rate's evictions must not carry over
                engine.reset_residency()
            result = run_trace(
                engine,
                trace,
                arrivals,
                rate,
                progress=not args.no_progress,
                desc=f"{policy} @ {rate:g} req/s",
            )
            engine.check_invariants()
            if engine.num_leaked_pages():
                raise RuntimeError(f"{policy}: {engine.num_leaked_pages()} KV pages leaked")
            results.append(result)
            write_results(
                out_dir / "results.json", results
            )  # after every run: partial results survive
    path = write_results(out_dir / "results.json", results)
    figures = [
        plot_memory_split(
            [r for r in results if r.request_rate == rates[-1]], out_dir / "fig4_memory_split.png"
        )
    ]
    if len(rates) > 1 and all(math.isfinite(r) for r in rates):
        figures.append(plot_rate_sweep(results, out_dir / "fig9_rate_sweep.png"))
    print(format_table(results))
    print(f"\nresults: {path}\nfigures: {', '.join(str(f) for f in figures)}")
    return 0


def run_trace(*args, **kwargs):
    from rimuru.dataplane.bench.runner import run_trace as _run_trace

    return _run_trace(*args, **kwargs)


COLUMNS = (
    ("policy", "policy", "{}"),
    ("rate", "request_rate", "{:g}"),
    ("peak conc", "peak_running", "{}"),
    ("steps", "forward_steps", "{}"),
    ("out tok/s", "output_tok_s", "{:.1f}"),
    ("TTFT p50 ms", "ttft_p50_ms", "{:.0f}"),
    ("TTFT p99 ms", "ttft_p99_ms", "{:.0f}"),
    ("TPOT p50 ms", "tpot_p50_ms", "{:.1f}"),
    ("TPOT p99 ms", "tpot_p99_ms", "{:.1f}"),
    ("preempt", "preemptions", "{}"),
    ("evict", "evictions", "{}"),
    ("loads", "loads", "{}"),
)


def format_table(results: list[BenchResult]) -> str:
    rows = [[title for title, _, _ in COLUMNS]]
    for r in results:
        h = r.headline()
        rows.append([fmt.format(h[key]) if h[key] is not None else "-" for _, key, fmt in COLUMNS])
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
