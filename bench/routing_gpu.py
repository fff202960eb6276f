"""The routing steps of a MoE layer on the GPU: each kernel against the torch chain it replaces.

    python3 bench/routing_gpu.py [--out-dir DIR] [--tokens 1,8,...] [--models all]

Per model shape and token count, on skewed random routing (moe_bench.random_routing, skew
1.0: the presets' router):
  router    router_topk (one launch) vs the torch chain (float, + bias, softmax, topk,
            renormalise): ids equal, max |weight difference|, µs each
  align     moe_align_block_size on each path (the single-program ones where they compile):
            the same blocks as the torch reference, µs each; and the path taken by default
  counts    count_routes (one launch) vs the torch histogram chain (zeros, expand,
            scatter_add, add): counts equal, µs each
Times are medians of CUDA-graph replays (L2 flushed), as the engine replays them. The last
lines printed are the table; full figures go to DIR/routing_gpu.json.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

from rimuru.dataplane.model.layers import router_topk as router_topk_reference
from rimuru.kernels.moe_align import (
    ALIGN_PATHS,
    align_variant,
    moe_align_block_size,
    moe_align_block_size_reference,
)
from rimuru.kernels.moe_bench import MODELS, model_names, replay_ms, run_info
from rimuru.kernels.route_counts import count_routes, count_routes_reference
from rimuru.kernels.router_topk import router_topk

DEVICE = torch.device("cuda")
REP_MS = 20.0


def router_case(shape, tokens: int, seed: int) -> dict:
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    logits = torch.randn(tokens, shape.num_experts, generator=gen, device=DEVICE)
    logits = logits.to(torch.bfloat16)  # the router GEMM's output dtype
    rank = torch.randperm(shape.num_experts, generator=gen, device=DEVICE)
    bias = -torch.log1p(rank.float())
    ids, weights = router_topk(logits, bias, shape.top_k, True)
    ref_ids, ref_weights = router_topk_reference(logits, bias, shape.top_k, True)
    # bf16 logits tie often; a tie may be ordered either way, so compare chosen sets where
    # the k-th and (k+1)-th logits differ
    return {
        "ids_equal": bool(torch.equal(ids, ref_ids)),
        "id_sets_equal": bool(torch.equal(ids.sort(1).values, ref_ids.sort(1).values)),
        "max_weight_diff": float((weights - ref_weights).abs().max()),
        "kernel_us": 1e3 * replay_ms(lambda: router_topk(logits, bias, shape.top_k, True), REP_MS),
        "torch_us": 1e3
        * replay_ms(lambda: router_topk_reference(logits, bias, shape.top_k, True), REP_MS),
        "ids": ids,
    }


def align_case(shape, ids: torch.Tensor, block_m: int) -> dict:
    ref = moe_align_block_size_reference(ids.cpu(), shape.num_experts, block_m)
    used = int(ref.num_padded)
    out = {"default": align_variant(ids.numel(), shape.num_experts, block_m)[0]}
    for path in ALIGN_PATHS:
        try:
            got = moe_align_block_size(ids, shape.num_experts, block_m, path=path)
            us = 1e3 * replay_ms(
                lambda p=path: moe_align_block_size(ids, shape.num_experts, block_m, path=p),
                REP_MS,
            )
        except Exception as exc:  # a one-hot past the SM's shared memory: not a candidate
            out[path] = {"error": f"{type(exc).__name__}: {str(exc)[:100]}"}
            continue
        same = int(got.num_padded) == used and torch.equal(
            got.block_expert_ids.cpu(), ref.block_expert_ids
        )
        same = same and torch.equal(
            got.sorted_pair_ids[:used].cpu().sort().values, ref.sorted_pair_ids[:used].sort().values
        )
        out[path] = {"same_as_reference": bool(same), "us": us}
    return out


def counts_case(shape, ids: torch.Tensor) -> dict:
    rows = (torch.arange(ids.shape[0], device=DEVICE) % 5 != 4).to(torch.int64)  # padding rows
    stats = torch.zeros(shape.num_experts, dtype=torch.int64, device=DEVICE)

    def torch_chain():
        counts = torch.zeros(shape.num_experts, dtype=torch.int64, device=DEVICE)
        stats.add_(count_routes_reference(ids, rows, counts))

    got = count_routes(ids, rows, torch.zeros_like(stats))
    want = count_routes_reference(ids, rows, torch.zeros_like(stats))
    return {
        "equal": bool(torch.equal(got, want)),
        "kernel_us": 1e3 * replay_ms(lambda: count_routes(ids, rows, stats), REP_MS),
        "torch_us": 1e3 * replay_ms(torch_chain, REP_MS),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=Path("."))
    parser.add_argument("--models", default="qwen3-30b-a3b,qwen1.5-moe-a2.7b")
    parser.add_argument("--tokens", default="1,8,16,32,64,128,256,512")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("routing_gpu.py needs a CUDA GPU", file=sys.stderr)
        return 2
    try:
        names = model_names(args.models)
        tokens = [int(t) for t in args.tokens.split(",")]
    except ValueError as exc:
        print(f"routing_gpu.py: {exc}", file=sys.stderr)
        return 2
    from rimuru.kernels.moe_configs import get_moe_config

    rows = []
    for name in names:
        shape = MODELS[name]
        for n in tokens:
            router = router_case(shape, n, seed=n)
            ids = router.pop("ids")
            block_m = get_moe_config(
                shape.num_experts, shape.inter_size, shape.hidden_size, n, shape.top_k,
                torch.bfloat16, DEVICE,
            ).block_m  # fmt: skip
            rows.append({
                "model": shape.name, "tokens": n, "block_m": block_m, "router": router,
                "align": align_case(shape, ids, block_m), "counts": counts_case(shape, ids),
            })  # fmt: skip
            print(f"  {shape.name} T={n} done", flush=True)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "routing_gpu.json").write_text(
        json.dumps({**run_info(), "rows": rows}, indent=1) + "\n"
    )
    print(f"\n{'model':18s} {'T':>5s} | router us: kernel torch  ids= sets= max|dw| | align us: "
          f"scan   sort chunked default ok | counts us: kernel torch eq")  # fmt: skip
    for r in rows:
        ro, al, co = r["router"], r["align"], r["counts"]

        def us(path, al=al):
            return f"{al[path]['us']:6.1f}" if "us" in al[path] else f"{'-':>6s}"

        ok = all(v["same_as_reference"] for k, v in al.items() if k != "default" and "us" in v)
        print(f"{r['model']:18s} {r['tokens']:5d} | {ro['kernel_us']:6.1f} {ro['torch_us']:6.1f} "
              f"{ro['ids_equal']!s:5s} {ro['id_sets_equal']!s:5s} {ro['max_weight_diff']:.1e} | "
              f"{us('scan')} {us('sort')} {us('chunked')} {al['default']:>7s} {ok!s:5s} | "
              f"{co['kernel_us']:6.1f} {co['torch_us']:6.1f} {co['equal']!s}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
