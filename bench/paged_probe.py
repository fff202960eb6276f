"""Where the paged fused MoE's overhead over its contiguous twin comes from, stage by stage.

Usage (GPU):  python bench/paged_probe.py [--out DIR]

Why: in five kernel-table runs (11-30 13:24-15:06) the Qwen shapes at 2048 tokens were the
one bucket with a steady paged overhead (Qwen3 +0.75..+1.04%, Qwen1.5 +0.40..+1.13%) while
the kernels differ little between the paths (sm_90 PTX, 11-30 15:08 and 15:13: the up
GEMM's inner loops are identical, the page base a select in its prologue; the flattened down
GEMM's fused loop carries that per-tile select). Per case, tuned config, each stage
of fused_moe.py's ``_run`` is timed paged against contiguous in interleaved rounds with L2
flushed (ab_timing.py, as kernels_gpu.py times the whole), twice: with a share of the experts
in loading-buffer slots (kernels_gpu.py's fixture) and with every expert in the pool.

    align  moe_align_block_size with the expert table (writes block_pages) vs without
    up     launch_up_gemm, pages vs the w13 stack
    down   launch_down_gemm, pages vs the w2 stack
    whole  fused_moe_paged vs fused_moe_contiguous

The table is printed last; the figures go to DIR/paged_probe.json.
"""

import argparse
import functools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from ab_timing import interleaved_samples, summarize_ab
from tune_moe import MODELS, graph_of, make_experts, random_routing, run_info

from rimuru.kernels import fused_moe_contiguous, fused_moe_paged, get_moe_config
from rimuru.kernels.moe_align import moe_align_block_size
from rimuru.kernels.moe_gemm import WeightSource, launch_down_gemm, launch_up_gemm

CASES = [("qwen3-30b-a3b", 2048), ("qwen1.5-moe-a2.7b", 2048), ("qwen3-30b-a3b", 4096)]
BUFFERED_SHARES = (0.125, 0.0)  # kernels_gpu.py's fixture; every expert in the pool
DEVICE = torch.device("cuda")


def stage_pairs(shape, experts, num_tokens: int) -> dict[str, tuple]:
    """(paged, contiguous) launchers of each stage, on kernels_gpu.py's routing (seed = T)."""
    e, k, inter = experts, shape.top_k, shape.inter_size
    ids, weights = random_routing(num_tokens, shape, DEVICE, seed=num_tokens)
    x = torch.randn(num_tokens, shape.hidden_size, device=DEVICE).to(torch.bfloat16)
    config = get_moe_config(shape.num_experts, inter, shape.hidden_size, num_tokens, k, x.dtype,
                            DEVICE)  # fmt: skip
    E, bm = shape.num_experts, config.block_m
    aligns = {"paged": moe_align_block_size(ids, E, bm, e.expert_table),
              "contig": moe_align_block_size(ids, E, bm)}  # fmt: skip
    sources = {
        "paged": (e.paged_source(), e.paged_source()),
        "contig": (WeightSource(e.w13, e.w13, False, 0, e.w13.stride(0)),
                   WeightSource(e.w2, e.w2, False, 0, e.w2.stride(0))),
    }  # fmt: skip
    w = weights.to(torch.float32).contiguous().view(-1)
    rows = aligns["paged"].max_blocks * bm
    act = {p: torch.randn(rows, inter, device=DEVICE).to(x.dtype) for p in aligns}
    y = {
        p: torch.empty(ids.numel(), shape.hidden_size, device=DEVICE, dtype=x.dtype) for p in aligns
    }
    out = {p: torch.empty_like(x) for p in aligns}
    whole = {
        "paged": functools.partial(fused_moe_paged, x, ids, weights, e.pool_pages,
                                   e.buffer_pages, e.expert_table, config=config, out=out["paged"]),
        "contig": functools.partial(fused_moe_contiguous, x, ids, weights, e.w13, e.w2,
                                    config=config, out=out["contig"]),
    }  # fmt: skip
    stages = {}
    for path in ("paged", "contig"):
        (up_src, down_src), al = sources[path], aligns[path]
        table = e.expert_table if path == "paged" else None
        stages[path] = {
            "align": functools.partial(moe_align_block_size, ids, E, bm, table),
            "up": functools.partial(launch_up_gemm, x, act[path], up_src, al, w, config.gemm1,
                                    inter_size=inter, top_k=k),
            "down": functools.partial(launch_down_gemm, act[path], y[path], down_src, al, w,
                                      config.gemm2, inter_size=inter, top_k=k),
            "whole": whole[path],
        }  # fmt: skip
    return {stage: (stages["paged"][stage], stages["contig"][stage]) for stage in stages["paged"]}


def probe_case(name: str, num_tokens: int) -> list[dict]:
    shape = MODELS[name]
    rows = []
    for share in BUFFERED_SHARES:
        experts = make_experts(shape, torch.bfloat16, DEVICE, seed=0, buffered_share=share)
        for stage, (paged, contig) in stage_pairs(shape, experts, num_tokens).items():
            gp, gc = graph_of(paged), graph_of(contig)
            ab = summarize_ab(*interleaved_samples(gp.replay, gc.replay, rounds=12, reps=25))
            rows.append({
                "model": shape.name, "tokens": num_tokens, "buffered_share": share, "stage": stage,
                "paged_us": 1e6 * ab.a_s, "contig_us": 1e6 * ab.b_s,
                "overhead_pct": 100 * (ab.ratio - 1), "overhead_us": 1e6 * ab.b_s * (ab.ratio - 1),
                "iqr_pct": [100 * (ab.ratio_q1 - 1), 100 * (ab.ratio_q3 - 1)],
            })  # fmt: skip
            r = rows[-1]
            print(f"  {shape.name:18s} T={num_tokens} share {share:5.3f} {stage:5s} paged "
                  f"{r['paged_us']:7.1f} contig {r['contig_us']:7.1f} us {r['overhead_pct']:+6.2f}%",
                  flush=True)  # fmt: skip
            del gp, gc
        del experts
        torch.cuda.empty_cache()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("paged_probe.py needs a CUDA GPU", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, n in CASES:
        rows += probe_case(name, n)
        (args.out / "paged_probe.json").write_text(
            json.dumps({**run_info(), "rows": rows}, indent=1)
        )
    print("\n==== paged vs contiguous by stage (bf16; median us; overhead = median of round "
          "ratios, IQR) ====")  # fmt: skip
    print(f"{'model':18s} {'T':>5} {'share':>6} {'stage':5s} {'paged':>8} {'contig':>8} "
          f"{'ovh %':>7} {'ovh us':>7} {'IQR %':>14}")  # fmt: skip
    for r in rows:
        print(f"{r['model']:18s} {r['tokens']:5d} {r['buffered_share']:6.3f} {r['stage']:5s} "
              f"{r['paged_us']:8.1f} {r['contig_us']:8.1f} {r['overhead_pct']:+7.2f} "
              f"{r['overhead_us']:+7.2f} {r['iqr_pct'][0]:+6.2f}..{r['iqr_pct'][1]:+6.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
