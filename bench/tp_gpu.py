"""Tensor parallel on the GPUs of one host: TP=N against TP=1, one run each.

    python3 bench/tp_gpu.py checks --tp 2 --out $OUT       # TP=N's tokens are TP=1's
    python3 bench/tp_gpu.py throughput --tp 2 --out $OUT   # output tok/s, TP=N vs TP=1

checks: greedy and seeded-sampled tokens of --model under resident, fixed and elastic, TP=1
  on one device against TP=N (one process per GPU, NCCL), on the same per-GPU budget.
  fp32 by default: slices summed across ranks equal the whole GEMM to rounding, which fp32
  keeps below a token flip; in bf16 (--dtype bfloat16) a late token may differ, and the
  row says how many tokens matched before the first difference.
throughput: the first --num-prompts requests of the bundled ShareGPT trace at once, each
  policy at TP=1 and at TP=N; output tok/s, TPOT p50, preemptions, evictions. TP=N has N
  times the memory (the budget flags are per GPU), so it may also run more at once.
Prints a table last and writes <out>/tp_gpu.json. On the CPU (--device cpu) the same runs
use gloo: what the test suite runs at a tiny size, so the script does not rot.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from rimuru.dataplane.bench.arrivals import arrival_times
from rimuru.dataplane.bench.runner import run_trace
from rimuru.dataplane.bench.trace import load_trace
from rimuru.dataplane.engine.sched.request import SamplingParams
from rimuru.dataplane.engine.startup.config import EngineConfig
from rimuru.dataplane.parallel.launch import engine_builder
from rimuru.policy import MODES, Tunables
from rimuru.sizes import parse_bytes


def _params(max_tokens: int) -> dict[str, SamplingParams]:
    return {
        "greedy": SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        "seeded": SamplingParams(
            max_tokens=max_tokens, temperature=1.0, top_p=0.9, seed=5, ignore_eos=True
        ),
    }


def _config(args: argparse.Namespace, mode: str, size: int) -> EngineConfig:
    return EngineConfig(
        model=args.model,
        dtype=args.dtype,
        device=args.device if size > 1 or args.device == "cpu" else f"{args.device}:0",
        memory_budget=parse_bytes(args.memory_budget) if args.memory_budget else None,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        tunables=Tunables(mode=mode, expert_offload_limit=args.expert_offload_limit),
        tensor_parallel_size=size,
        activation_reserve=parse_bytes(args.activation_reserve)
        if args.activation_reserve
        else None,
    )


def _matched(a: list[int], b: list[int]) -> int:
    """Tokens equal before the first difference."""
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def checks(args: argparse.Namespace) -> list[dict]:
    trace = load_trace(args.trace).head(args.num_prompts)
    prompts = [list(r.prompt_token_ids) for r in trace.requests]
    params = _params(args.max_tokens or 32)
    outputs: dict[tuple[int, str, str], list[list[int]]] = {}
    stats: dict[tuple[int, str], dict] = {}
    for size in (1, args.tp):
        with engine_builder(_config(args, "resident", size)) as build:
            for mode in MODES:
                engine = build(_config(args, mode, size), log_plan=False)
                for name, sampling in params.items():
                    outputs[size, mode, name] = engine.generate(prompts, sampling)
                engine.check_invariants()
                stats[size, mode] = {
                    "preemptions": engine.scheduler.num_preemptions,
                    "evictions": engine.expert_counters.evictions,
                }
                engine.close()
    rows = []
    for mode in MODES:
        for name in params:
            one, many = outputs[1, mode, name], outputs[args.tp, mode, name]
            total = sum(len(o) for o in one)
            matched = sum(_matched(a, b) for a, b in zip(one, many, strict=True))
            rows.append(
                {"check": f"{mode} {name}", "equal": one == many, "matched": f"{matched}/{total}",
                 **{f"tp{args.tp}_{k}": v for k, v in stats[args.tp, mode].items()}}
            )  # fmt: skip
    return rows


def throughput(args: argparse.Namespace) -> list[dict]:
    trace = load_trace(args.trace).head(args.num_prompts)
    if args.max_tokens is not None:  # a short run (the CPU test): outputs capped
        capped = [replace(r, output_len=min(r.output_len, args.max_tokens)) for r in trace.requests]
        trace = replace(trace, requests=capped)
    arrivals = arrival_times(len(trace), float("inf"), 1.0, 0).tolist()
    rows = []
    for size in (1, args.tp):
        with engine_builder(_config(args, "resident", size)) as build:
            for mode in MODES:
                engine = build(_config(args, mode, size), log_plan=False)
                result = run_trace(engine, trace, arrivals, float("inf"), progress=False)
                engine.close()
                h = result.headline()
                rows.append(
                    {"tp": size, "policy": mode, "output_tok_s": round(h["output_tok_s"], 1),
                     "tpot_p50_ms": round(h["tpot_p50_ms"], 1), "peak_running": h["peak_running"],
                     "preemptions": h["preemptions"], "evictions": h["evictions"]}
                )  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run", choices=("checks", "throughput"))
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument(
        "--model", default=None, help="checks: qwen1.5-moe-a2.7b, throughput: qwen3-30b-a3b"
    )
    p.add_argument("--dtype", default=None, help="checks default to float32")
    p.add_argument("--memory-budget", default=None, help="per GPU, e.g. 40GiB")
    p.add_argument("--gpu-memory-utilization", type=float, default=None)
    p.add_argument("--activation-reserve", default=None)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--expert-offload-limit", type=int, default=32)
    p.add_argument("--trace", default="sharegpt_qwen_1000")
    p.add_argument("--num-prompts", type=int, default=None, help="checks 16, throughput 500")
    p.add_argument(
        "--max-tokens", type=int, default=None,
        help="checks: tokens per prompt (default 32); throughput: a cap on the trace's",
    )  # fmt: skip
    p.add_argument("--out", default="out/tp_gpu")
    args = p.parse_args(argv)
    if args.tp < 2:
        p.error("--tp must be >= 2 (it is compared with TP=1)")
    if args.device == "cuda" and torch.cuda.device_count() < args.tp:
        print(f"tp_gpu: --tp {args.tp} needs {args.tp} GPUs, {torch.cuda.device_count()} "
              f"visible", file=sys.stderr)  # fmt: skip
        return 2
    if args.run == "checks":  # fp32 Qwen1.5-MoE-A2.7B (57 GB) fits one GPU for TP=1
        args.dtype = args.dtype or "float32"
        args.model = args.model or "qwen1.5-moe-a2.7b"
    args.model = args.model or "qwen3-30b-a3b"
    args.num_prompts = args.num_prompts or (16 if args.run == "checks" else 500)
    started = time.monotonic()
    rows = checks(args) if args.run == "checks" else throughput(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    document = {"run": args.run, "args": vars(args), "rows": rows,
                "seconds": round(time.monotonic() - started, 1)}  # fmt: skip
    (out / "tp_gpu.json").write_text(json.dumps(document, indent=1))
    columns = list(rows[0])
    print("  ".join(columns))
    for row in rows:
        print("  ".join(str(row[c]) for c in columns))
    failed = args.run == "checks" and args.dtype == "float32" and not all(r["equal"] for r in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
