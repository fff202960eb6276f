"""Where the fused MoE's time goes: each stage of fused_moe.py's ``_run`` timed alone, vs its floor.

Usage (GPU):  python bench/moe_breakdown.py [--models all] [--tokens 1024,2048,4096] [--out DIR]

Shape key: T = tokens, K = top-k, P = T*K pairs, E = experts, I = expert intermediate, D = hidden.

Per model and token count (tuned config, kernels_gpu.py's experts and routing seed = T), on the
contiguous path (w13 / w2 stacks) and the paged path (pool pages + loading buffer), each stage
runs in its own CUDA graph, timed like tune_moe.py (median of replays, L2 flushed before each):

    align  moe_align_block_size              bytes/s: ids in; sorted ids, block ids (+ pages) out
    up     launch_up_gemm, alignment ready   floor max(2*P*D*2I / 755e12, w1+w3 + x + act / 4.17e12)
    down   launch_down_gemm                  floor max(2*P*I*D / 755e12, w2 + act + y / 4.17e12)
    sum    moe_sum over the top-k            bytes/s: y read + out written (torch.sum beside it)
    whole  fused_moe_contiguous / fused_moe_paged in one graph; gap = whole - (sum of stages)

Weights are counted for touched experts only. Each stage starts from a cold L2 and pays its own
graph launch, so the gap can be negative (inside `whole`, down finds part of act in L2).
pad = num_padded / P: padded rows cost tensor-core work that nobody reads; rows = the rows
the up GEMM computes / P (less than pad with tail tiles, GemmTile.tail). The bmm row is
cuBLAS (torch.bmm) on an equal split of the same work, ceil(P/E) rows for every expert, against
the same floors: what a dense grouped GEMM achieves here. The table is printed last; the figures
go to DIR/moe_breakdown.json.
"""

import argparse
import functools
import json
import sys
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).parent))
from tune_moe import (
    MODELS,
    PEAK_BYTES,
    PEAK_FLOPS,
    MoeShape,
    PagedExperts,
    make_experts,
    model_names,
    random_routing,
    replay_ms,
    run_info,
)

from rimuru.kernels import fused_moe_contiguous, fused_moe_paged, get_moe_config
from rimuru.kernels.moe_align import moe_align_block_size
from rimuru.kernels.moe_configs import MoeConfig
from rimuru.kernels.moe_gemm import WeightSource, launch_down_gemm, launch_up_gemm
from rimuru.kernels.moe_sum import moe_sum

ELEM = 2  # bytes of a bf16 element
DEVICE = torch.device("cuda")


def replay_us(fn: Callable[[], object], rep_ms: float) -> float:
    """tune_moe.replay_ms in µs; a failure reaches the model's guard."""
    return 1e3 * replay_ms(fn, rep_ms)


def floor_us(flops: float, nbytes: float) -> float:
    return 1e6 * max(flops / PEAK_FLOPS, nbytes / PEAK_BYTES)


def gemm_floors_us(shape: MoeShape, num_tokens: int, touched: int) -> tuple[float, float]:
    inter, hidden = shape.inter_size, shape.hidden_size
    pairs = num_tokens * shape.top_k
    up = floor_us(
        2 * pairs * hidden * 2 * inter,
        ELEM * (touched * 2 * inter * hidden + num_tokens * hidden + pairs * inter),
    )
    down = floor_us(
        2 * pairs * inter * hidden,
        ELEM * (touched * hidden * inter + pairs * inter + pairs * hidden),
    )
    return up, down


def time_path(paged: bool, shape: MoeShape, experts: PagedExperts, x: torch.Tensor,
              ids: torch.Tensor, weights: torch.Tensor, config: MoeConfig, rep_ms: float) -> dict:  # fmt: skip
    """Each stage of _run alone, then the whole launcher, on one path (module doc)."""
    (T, D), E, inter, k = x.shape, shape.num_experts, shape.inter_size, shape.top_k
    P, e = T * k, experts
    out = torch.empty_like(x)  # [T, D]
    if paged:
        up_src = down_src = e.paged_source()
        table = e.expert_table
        whole = functools.partial(
            fused_moe_paged, x, ids, weights, e.pool_pages, e.buffer_pages, table,
            config=config, out=out,
        )  # fmt: skip
    else:  # the sources fused_moe_contiguous builds
        up_src = WeightSource(e.w13, e.w13, False, 0, e.w13.stride(0))
        down_src = WeightSource(e.w2, e.w2, False, 0, e.w2.stride(0))
        table = None
        whole = functools.partial(
            fused_moe_contiguous, x, ids, weights, e.w13, e.w2, config=config, out=out
        )
    align = moe_align_block_size(ids, E, config.block_m, table)
    w = weights.to(torch.float32).contiguous().view(-1)  # [P], as _run passes it
    act = torch.empty(align.max_blocks * align.block_m, inter, dtype=x.dtype, device=x.device)
    y = torch.empty(P, D, dtype=x.dtype, device=x.device)  # [P, D]
    up = functools.partial(
        launch_up_gemm, x, act, up_src, align, w, config.gemm1, inter_size=inter, top_k=k
    )
    down = functools.partial(
        launch_down_gemm, act, y, down_src, align, w, config.gemm2, inter_size=inter, top_k=k
    )
    up()
    down()  # so the timed down reads a real act and the timed sum a real y
    torch.cuda.synchronize()  # num_padded is written on the device
    num_padded = int(align.num_padded.item())
    # Pairs in each block in use, for the rows each GEMM computes under its tail setting.
    counts = (align.sorted_pair_ids[:num_padded].view(-1, align.block_m) < P).sum(1).tolist()
    align_again = functools.partial(moe_align_block_size, ids, E, config.block_m, table)
    us = {
        "align": replay_us(align_again, rep_ms),
        "up": replay_us(up, rep_ms),
        "down": replay_us(down, rep_ms),
        "sum": replay_us(lambda: moe_sum(y, out, k), rep_ms),
        # torch.sum, what _run used before moe_sum (11-30): the same-run A/B of the two
        "torch_sum": replay_us(lambda: torch.sum(y.view(T, k, D), dim=1, out=out), rep_ms),
        "whole": replay_us(whole, rep_ms),
    }  # fmt: skip
    stages = us["align"] + us["up"] + us["down"] + us["sum"]
    # The outputs align must write (block_pages too when paged) and the ids it must read.
    align_bytes = 4 * (P + num_padded + align.max_blocks * (4 if paged else 1))
    sum_bytes = ELEM * (P * D + T * D)
    return {
        **{f"{name}_us": t for name, t in us.items()},
        "stages_us": stages,
        "gap_us": us["whole"] - stages,
        "num_padded": num_padded,
        "padding": num_padded / P,
        "up_rows": rows_computed(counts, align.block_m, config.gemm1.tail) / P,
        "down_rows": rows_computed(counts, align.block_m, config.gemm2.tail) / P,
        "align_bytes_per_s": align_bytes / (us["align"] * 1e-6),
        "sum_bytes_per_s": sum_bytes / (us["sum"] * 1e-6),
    }


def rows_computed(counts: list[int], block_m: int, tail: int) -> int:
    """Rows a GEMM's tiles compute over blocks holding these pair counts (moe_gemm.py's tail
    rule: a block with at most block_m >> h pairs, h <= tail, computes block_m >> h rows)."""
    total = 0
    for c in counts:
        rows = block_m
        for h in range(1, tail + 1):
            if c <= block_m >> h:
                rows = block_m >> h
        total += rows
    return total


def time_bmm(shape: MoeShape, experts: PagedExperts, pairs: int, rep_ms: float) -> dict:
    """cuBLAS on the equal split: [E, m, D] x [E, D, 2I] and [E, m, I] x [E, I, D], m = ceil(P/E)."""
    E, inter, D = shape.num_experts, shape.inter_size, shape.hidden_size
    m = triton.cdiv(pairs, E)
    a_up = torch.randn(E, m, D, device=DEVICE).to(torch.bfloat16)
    a_down = torch.randn(E, m, inter, device=DEVICE).to(torch.bfloat16)
    # Transposed views of the stacks: cuBLAS reads them in place (transa), like the kernels do.
    b_up, b_down = experts.w13.transpose(1, 2), experts.w2.transpose(1, 2)
    c_up = torch.empty(E, m, 2 * inter, device=DEVICE, dtype=torch.bfloat16)
    c_down = torch.empty(E, m, D, device=DEVICE, dtype=torch.bfloat16)
    return {
        "rows_per_expert": m,
        "up_us": replay_us(functools.partial(torch.bmm, a_up, b_up, out=c_up), rep_ms),
        "down_us": replay_us(functools.partial(torch.bmm, a_down, b_down, out=c_down), rep_ms),
    }


def breakdown_model(shape: MoeShape, tokens: list[int], rep_ms: float) -> list[dict]:
    experts = make_experts(shape, torch.bfloat16, DEVICE, seed=0)  # kernels_gpu.py's experts
    rows = []
    for n in tokens:
        ids, weights = random_routing(n, shape, DEVICE, seed=n)  # kernels_gpu.time_moe's seed
        x = torch.randn(n, shape.hidden_size, device=DEVICE).to(torch.bfloat16)
        E, inter, D, k = shape.num_experts, shape.inter_size, shape.hidden_size, shape.top_k
        config = get_moe_config(E, inter, D, n, k, x.dtype, DEVICE)
        touched = int(torch.unique(ids).numel())
        up_floor, down_floor = gemm_floors_us(shape, n, touched)
        row = {"tokens": n, "pairs": n * k, "touched_experts": touched,
               "config": config.to_json(), "up_floor_us": up_floor, "down_floor_us": down_floor}  # fmt: skip
        row["contiguous"] = time_path(False, shape, experts, x, ids, weights, config, rep_ms)
        row["paged"] = time_path(True, shape, experts, x, ids, weights, config, rep_ms)
        row["bmm"] = time_bmm(shape, experts, n * k, rep_ms)
        for part in (row["contiguous"], row["paged"], row["bmm"]):
            part["up_over_floor"] = part["up_us"] / up_floor
            part["down_over_floor"] = part["down_us"] / down_floor
        c, p = row["contiguous"], row["paged"]
        print(f"  {shape.name:18s} T={n:5d} bm={config.block_m:3d} whole contig {c['whole_us']:8.1f} "
              f"paged {p['whole_us']:8.1f} us; up/floor {c['up_over_floor']:.2f} "
              f"down/floor {c['down_over_floor']:.2f}", flush=True)  # fmt: skip
        rows.append(row)
    return rows


def summarize(report: dict) -> None:
    print(
        "\n==== fused MoE stage breakdown (bf16; us, x = over floor; pad = num_padded / P, "
        "rows = up GEMM rows computed / P; t.sum = torch.sum in place of moe_sum) ===="
    )
    print(f"{'model':18s} {'T':>5} {'path':6s} {'pad':>5} {'rows':>5} {'align':>6} {'GB/s':>5} {'up':>7} "
          f"{'x':>5} {'down':>7} {'x':>5} {'sum':>6} {'TB/s':>5} {'t.sum':>6} {'stages':>7} {'whole':>7} {'gap':>6}")  # fmt: skip
    for name, m in report["models"].items():
        if "error" in m:
            print(f"{name}: FAILED {m['error']}")
            continue
        for r in m["rows"]:
            head = f"{m['shape']['name']:18s} {r['tokens']:5d}"
            for path in ("contiguous", "paged"):
                s = r[path]
                print(f"{head} {path[:6]:6s} {s['padding']:5.2f} {s['up_rows']:5.2f} {s['align_us']:6.1f} "
                      f"{s['align_bytes_per_s'] / 1e9:5.1f} {s['up_us']:7.1f} {s['up_over_floor']:5.2f} "
                      f"{s['down_us']:7.1f} {s['down_over_floor']:5.2f} {s['sum_us']:6.1f} "
                      f"{s['sum_bytes_per_s'] / 1e12:5.2f} {s['torch_sum_us']:6.1f} {s['stages_us']:7.1f} {s['whole_us']:7.1f} "
                      f"{s['gap_us']:+6.1f}")  # fmt: skip
            b, dash = r["bmm"], "-"
            print(f"{head} {'bmm':6s} {dash:>5} {dash:>5} {dash:>6} {dash:>5} {b['up_us']:7.1f} "
                  f"{b['up_over_floor']:5.2f} {b['down_us']:7.1f} {b['down_over_floor']:5.2f}")  # fmt: skip
            print(f"{head} {'floor':6s} {dash:>5} {dash:>5} {dash:>6} {dash:>5} {r['up_floor_us']:7.1f} "
                  f"{1:5.2f} {r['down_floor_us']:7.1f} {1:5.2f}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="all", help=f"comma list of {sorted(MODELS)} or 'all'")
    parser.add_argument("--tokens", default="1024,2048,4096", help="comma list of token counts")
    parser.add_argument("--out", type=Path, default=Path("."), help="directory for the JSON")
    parser.add_argument("--rep-ms", type=float, default=50.0, help="do_bench repetition time")
    args = parser.parse_args()
    try:
        names = model_names(args.models)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("moe_breakdown.py needs a CUDA GPU (it times CUDA-graph replays)", file=sys.stderr)
        return 2
    tokens = [int(t) for t in args.tokens.split(",")]
    report = {
        **run_info(),
        "peak_flops": PEAK_FLOPS,
        "peak_bytes_per_s": PEAK_BYTES,
        "rep_ms": args.rep_ms,
        "models": {},
    }
    for name in names:
        shape = MODELS[name]
        try:
            rows = breakdown_model(shape, tokens, args.rep_ms)
            report["models"][name] = {"shape": asdict(shape), "rows": rows}
        except Exception as exc:
            traceback.print_exc()
            report["models"][name] = {"error": repr(exc)[:300]}
        # Here, not in the handler: the traceback's frames hold the failed model's experts.
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "moe_breakdown.json").write_text(json.dumps(report, indent=1) + "\n")
    summarize(report)
    return 1 if any("error" in m for m in report["models"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
