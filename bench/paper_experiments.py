"""The paper's experiments 1-4, each sized to run in under 10 minutes on one GPU.

    python3 bench/paper_experiments.py fig4 --out $OUT [--num-prompts 500] [--fixed-expert-share 0.75]
    python3 bench/paper_experiments.py rate-sweep --policy elastic --out $OUT   # x3 policies
    python3 bench/paper_experiments.py ablation --out $OUT
    python3 bench/paper_experiments.py offload-sweep --limits 0,5,10 --out $OUT  # and 15,20,30
    python3 bench/paper_experiments.py merge DIR... --out docs/figures            # CPU, after
    python3 bench/paper_experiments.py merge A/results.json B/ --fig4 fig4.png --out DIR

Flags this script does not know go to `rimuru bench` as they are (e.g.
`--fixed-expert-share 0.75`). Defaults are the GPU setups; `--model tiny --device cpu --num-prompts 20` runs each one
as a smoke test on a laptop.

fig4 (Experiment 1): `qwen1.5-moe-a2.7b` (bf16), budget 28.8 GiB (0.9 x an RTX 5090's
  32 GiB), ShareGPT at 10 req/s, the policies of --policies on one budget (all three by
  default) with --expert-offload-limit 30; results.json and the Fig. 4 PNG under --out.
rate-sweep: `qwen3-30b-a3b` (bf16), budget 59 GiB: all weights are 56.9 GiB (experts
  54.0 GiB, the rest 2.9 GiB), so they barely fit and the resident policy keeps little KV.
  Rates from light to overload, each with --num-prompts requests; one policy per call (one
  engine serves all rates, each rate from start-up residency).
ablation: `qwen1.5-moe-a2.7b`, 28.8 GiB, 10 req/s: fixed cache with gathered experts ->
  + adjuster (elastic, gathered) -> + paged kernel (elastic, in place); all three eager
  (--enforce-eager), so that decode CUDA graphs do not favour the paged arm.
offload-sweep: elastic with several expert_offload_limit values on a burst (all requests at
  t = 0): output throughput, and the recovery time — seconds from the deepest eviction to
  the moment every expert is resident again.
Prints a short table last. Presets carry seeded random weights: the figures measure the
serving system, not a model's answers.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

from rimuru.cli import main as rimuru_main
from rimuru.dataplane.bench.plots import plot_memory_split, plot_rate_sweep
from rimuru.dataplane.bench.results import BenchResult, read_results, write_results


def _bench(args: argparse.Namespace, out: Path, extra: list[str]) -> int:
    argv = [
        "bench",
        "--device", args.device,
        "--model", args.model,
        "--trace", args.trace,
        "--num-prompts", str(args.num_prompts),
        "--router-skew", str(args.router_skew),
        "--output-dir", str(out),
        "--no-progress",
        *extra,
        *args.passthrough,  # any other `rimuru bench` flag, e.g. --fixed-expert-share 0.75
    ]  # fmt: skip
    if args.memory_budget:
        argv += ["--memory-budget", args.memory_budget]
    code = rimuru_main(argv)  # on failure rimuru bench has said why
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the next engine of this call starts from a clean device
    return code


# Flags this script sets itself: passed through as well, the later one would silently win.
_OWN_BENCH_FLAGS = {
    "--device", "--model", "--trace", "--num-prompts", "--router-skew", "--output-dir",
    "--no-progress", "--memory-budget", "--policies", "--request-rate", "--expert-offload-limit",
    "--moe-path",
}  # fmt: skip


# The ablation sets these in every arm (a gather arm copies on the host's word).
_ABLATION_FLAGS = {"--enforce-eager", "--expert-copy"}


def own_flags_passed_through(passthrough: list[str]) -> list[str]:
    return [a for a in passthrough if a.split("=", 1)[0] in _OWN_BENCH_FLAGS]


def recovery_seconds(result: BenchResult) -> float | None:
    """From the step with the fewest resident experts to the first later step with as many
    resident as at the start (before the first step, which may evict already; older results
    files lack that count and use the first step's); None if the boundary never moved or
    never came back."""
    steps = result.steps
    if not steps:
        return None
    start = result.config.get("experts_resident_at_start", steps[0].num_experts_resident)
    low = min(range(len(steps)), key=lambda i: steps[i].num_experts_resident)
    if steps[low].num_experts_resident >= start:
        return None
    for s in steps[low:]:
        if s.num_experts_resident >= start:
            return s.time - steps[low].time
    return None


def table(rows: list[dict]) -> str:
    keys = list(rows[0])
    widths = [max(len(k), *(len(_fmt(r[k])) for r in rows)) for k in keys]
    lines = ["  ".join(k.rjust(w) for k, w in zip(keys, widths, strict=True))]
    lines += [
        "  ".join(_fmt(r[k]).rjust(w) for k, w in zip(keys, widths, strict=True)) for r in rows
    ]
    return "\n".join(lines)


def _fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:.1f}" if isinstance(v, float) else str(v)


def _row(label: str, r: BenchResult) -> dict:
    h = r.headline()
    return {
        "run": label,
        "rate": h["request_rate"],
        "peak": h["peak_running"],
        "steps": h["forward_steps"],
        "out tok/s": h["output_tok_s"],
        "TPOT p50": h["tpot_p50_ms"],
        "TTFT p50": h["ttft_p50_ms"],
        "evict": h["evictions"],
        "recovery s": recovery_seconds(r),
    }


def main() -> int:
    # No abbreviations: `--limit 30` must not be taken for --limits.
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument(
        "experiment", choices=("fig4", "rate-sweep", "ablation", "offload-sweep", "merge")
    )
    ap.add_argument("dirs", nargs="*", help="merge: result folders to combine")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default=None)
    ap.add_argument("--memory-budget", default=None)
    ap.add_argument("--trace", default="sharegpt_qwen_1000")
    ap.add_argument("--num-prompts", type=int, default=200)
    ap.add_argument("--router-skew", type=float, default=1.0)
    ap.add_argument("--policy", default="elastic")
    ap.add_argument("--rates", default="2,16")
    ap.add_argument("--limits", default="0,5,10")
    # fig4 only: the other experiments set the policies and the limit themselves
    ap.add_argument("--policies", default=None, help="fig4: default resident,fixed,elastic")
    ap.add_argument("--expert-offload-limit", default=None, help="fig4: default 30")
    ap.add_argument("--fig4", default=None, help="merge: also draw the merged runs as Fig. 4")
    ap.add_argument("--labels", default=None, help="merge --fig4: comma-separated panel names")
    args, passthrough = ap.parse_known_args()
    if passthrough and args.experiment == "merge":
        ap.error(f"merge takes no engine flags; got {passthrough}")
    if own_flags_passed_through(passthrough):
        ap.error(
            f"{own_flags_passed_through(passthrough)} are set by this script; use its own "
            "options (--rates, --limits, --policy, ...) instead"
        )
    fig4_only = [
        flag
        for flag, value in (
            ("--policies", args.policies),
            ("--expert-offload-limit", args.expert_offload_limit),
        )
        if value is not None
    ]
    if fig4_only and args.experiment != "fig4":
        ap.error(f"{fig4_only} are set by this script for {args.experiment}; only fig4 takes them")
    pinned = [a for a in passthrough if a.split("=", 1)[0] in _ABLATION_FLAGS]
    if args.experiment == "ablation" and pinned:
        ap.error(f"{pinned}: the ablation runs every arm eager and with host copies")
    args.passthrough = passthrough
    out = Path(args.out)
    rows: list[dict] = []
    code = 0
    if args.experiment == "merge":
        paths = [
            p
            for d in map(Path, args.dirs)
            for p in ([d] if d.is_file() else sorted(d.rglob("results.json")))
        ]
        results = [r for p in paths for r in read_results(p)]
        out.mkdir(parents=True, exist_ok=True)
        write_results(out / "merged_results.json", results)
        if args.fig4:
            labels = args.labels.split(",") if args.labels else None
            plot_memory_split(results, out / args.fig4, labels=labels)
        swept = [r for r in results if r.request_rate != float("inf")]
        if swept and not args.fig4:
            plot_rate_sweep(swept, out / "fig9_rate_sweep.png")
        rows = [_row(r.policy, r) for r in results]
    elif args.experiment == "fig4":
        args.model = args.model or "qwen1.5-moe-a2.7b"
        args.memory_budget = args.memory_budget or "28.8GiB"
        folder = out / "fig4"
        extra = ["--policies", args.policies or "resident,fixed,elastic", "--request-rate", "10",
                 "--expert-offload-limit", args.expert_offload_limit or "30"]  # fmt: skip
        if not any(a.split("=", 1)[0] == "--max-num-batched-tokens" for a in args.passthrough):
            # the engine's 2048-token steps (the recorded Fig. 4 runs), not the CPU quick
            # start's 1024 that `rimuru bench` defaults to
            extra += ["--max-num-batched-tokens", "2048"]
        code = _bench(args, folder, extra)
        if code == 0:
            rows = [_row(r.policy, r) for r in read_results(folder / "results.json")]
    elif args.experiment == "rate-sweep":
        args.model = args.model or "qwen3-30b-a3b"
        args.memory_budget = args.memory_budget or "59GiB"
        folder = out / f"rate_sweep_{args.policy}"
        code = _bench(
            args,
            folder,
            [
                "--policies",
                args.policy,
                "--request-rate",
                args.rates,
                "--expert-offload-limit",
                "32",
            ],
        )
        if code == 0:
            rows = [_row(r.policy, r) for r in read_results(folder / "results.json")]
    elif args.experiment == "ablation":
        args.model = args.model or "qwen1.5-moe-a2.7b"
        args.memory_budget = args.memory_budget or "28.8GiB"
        variants = [
            ("fixed cache (gather)", ["--policies", "fixed", "--moe-path", "gather"]),
            ("+ adjuster (gather)", ["--policies", "elastic", "--moe-path", "gather"]),
            ("+ paged kernel", ["--policies", "elastic", "--moe-path", "paged"]),
        ]
        for i, (label, extra) in enumerate(variants):
            folder = out / f"ablation_{i}"
            # eager and host copies in every arm: a gather copies on the host's word, so only
            # the paged arm could replay graphs or copy on the device, and the ablation
            # compares the adjuster and the kernel, not graphs or copy mechanisms
            code = _bench(
                args,
                folder,
                [*extra, "--request-rate", "10", "--expert-offload-limit", "10", "--enforce-eager",
                 "--expert-copy", "host"],
            )  # fmt: skip
            if code != 0:
                break
            rows += [_row(label, r) for r in read_results(folder / "results.json")]
    else:
        args.model = args.model or "qwen1.5-moe-a2.7b"
        args.memory_budget = args.memory_budget or "28.8GiB"
        for limit in args.limits.split(","):
            folder = out / f"offload_limit_{limit}"
            code = _bench(
                args,
                folder,
                ["--policies", "elastic", "--request-rate", "inf", "--expert-offload-limit", limit],
            )
            if code != 0:
                break
            rows += [_row(f"limit {limit}", r) for r in read_results(folder / "results.json")]
    if rows:  # what finished, even when a later run failed
        (out / f"{args.experiment}_table.json").write_text(json.dumps(rows, indent=1, default=str))
        print(table(rows))
    return code


if __name__ == "__main__":
    sys.exit(main())
