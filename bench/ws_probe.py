"""Probe: does Triton 3.6's Hopper warp specialization run a grouped down GEMM, and how fast?

Usage (GPU):  python bench/ws_probe.py [--out DIR]

An experiment, not a product kernel. The product's warp-specialized down GEMM faulted on the
H200 (11-30 13:07, illegal memory access); it made its tensor descriptors on the device, per
tile, inside the specialized loop. This probe is the smallest grouped GEMM that could take
warp specialization: the contiguous twin's down GEMM (y[p] = w[p] * act[r] . w2[e]^T, act in
sorted rows) with host-made descriptors over the whole stack (w2 viewed as [E*D, I], so no
descriptor is made in the loop), persistent programs, no tail tiles. Per shape it times, in
one run, the product kernel at its tuned tile (grid) and the probe with and without warp
specialization, and compares their outputs. The specialized variants run last, so a fault
in one loses none of the other figures (the first version ran each variant in a child
process and saved reference outputs under DIR: it ran past its 400 s at 13:31, and the
saved outputs made DIR too large to come back from the device). The table is printed last; figures go to DIR/ws_probe.json.
"""

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, str(Path(__file__).parent))
from tune_moe import MODELS, random_routing, replay_ms, run_info

from rimuru.kernels import get_moe_config
from rimuru.kernels.moe_align import moe_align_block_size
from rimuru.kernels.moe_gemm import WeightSource, launch_down_gemm

CASES = [("qwen3-30b-a3b", 4096), ("mixtral-8x7b", 1024)]
# (block_n, block_k, num_stages): 4 warps a partition, as the specialization compiles them.
PROBE_TILES = [(128, 64, 3), (256, 64, 3)]


@triton.jit
def _probe_down_kernel(
    a_desc, w_desc, y_ptr, weights_ptr, sorted_ptr, block_expert_ptr, num_padded_ptr,
    num_pairs, N, K, stride_y,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
):  # fmt: skip
    num_m = tl.load(num_padded_ptr) // BLOCK_M
    num_n = tl.cdiv(N, BLOCK_N)
    for tile in tl.range(
        tl.program_id(0), num_m * num_n, tl.num_programs(0), warp_specialize=WARP_SPECIALIZE
    ):
        group = GROUP_M * num_n
        first_m = (tile // group) * GROUP_M
        size = tl.minimum(num_m - first_m, GROUP_M)
        pid_m = first_m + (tile % group) % size
        pid_n = (tile % group) // size
        expert = tl.load(block_expert_ptr + pid_m)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            a = a_desc.load([pid_m * BLOCK_M, k * BLOCK_K])
            b = w_desc.load([expert * N + pid_n * BLOCK_N, k * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        pair = tl.load(sorted_ptr + rows)
        mask = pair < num_pairs
        acc = acc * tl.load(weights_ptr + pair, mask=mask, other=0.0)[:, None]
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        ptrs = y_ptr + pair.to(tl.int64)[:, None] * stride_y + cols[None, :]
        tl.store(ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask[:, None] & (cols < N)[None, :])


def _setup(name: str, num_tokens: int):
    shape = MODELS[name]
    E, inter, D = shape.num_experts, shape.inter_size, shape.hidden_size
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    w2 = (torch.randn(E, D, inter, generator=gen, device=dev) * inter**-0.5).to(torch.bfloat16)
    config = get_moe_config(E, inter, D, num_tokens, shape.top_k, torch.bfloat16, dev)
    ids, weights = random_routing(num_tokens, shape, dev, seed=num_tokens)
    align = moe_align_block_size(ids, E, config.block_m)
    act = torch.randn(align.max_blocks * config.block_m, inter, generator=gen, device=dev)
    return shape, w2, config, align, act.to(torch.bfloat16), weights.reshape(-1).float()


def _time_probe(case, tile, ws: bool, reference: torch.Tensor) -> dict:
    """One probe variant: its time and its output against the product's."""
    _, w2, config, align, act, weights = case
    block_n, block_k, stages = tile
    E, D, inter = w2.shape
    bm = config.block_m
    y = torch.full((weights.numel(), D), float("nan"), dtype=act.dtype, device=act.device)
    a_desc = TensorDescriptor.from_tensor(act, [bm, block_k])
    w_desc = TensorDescriptor.from_tensor(w2.view(E * D, inter), [block_n, block_k])
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    grid = (min(sms, align.max_blocks * triton.cdiv(D, block_n)),)

    def run():
        _probe_down_kernel[grid](
            a_desc, w_desc, y, weights, align.sorted_pair_ids, align.block_expert_ids,
            align.num_padded, align.num_pairs, D, inter, y.stride(0),
            BLOCK_M=bm, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8, WARP_SPECIALIZE=ws,
            num_warps=4, num_stages=stages,
        )  # fmt: skip

    run()
    torch.cuda.synchronize()
    diff = float((y.float() - reference).abs().max() / reference.abs().max())
    return {"us": replay_ms(run, 20.0) * 1e3, "max_rel_diff": diff}


def _product(case) -> tuple[float, torch.Tensor]:
    shape, w2, config, align, act, weights = case
    _, D, inter = w2.shape
    y = torch.empty(weights.numel(), D, dtype=act.dtype, device=act.device)
    source = WeightSource(w2, w2, False, 0, w2.stride(0))

    def run():
        launch_down_gemm(act, y, source, align, weights, config.gemm2, inter_size=inter,
                         top_k=shape.top_k)  # fmt: skip

    run()
    return replay_ms(run, 20.0) * 1e3, y.float()


def _row(case, variant: str, tile, r: dict, product_us: float) -> dict:
    shape, num_tokens = case[0], case[3].num_pairs // case[0].top_k
    row = {"model": shape.name, "tokens": num_tokens, "variant": variant, "tile": str(tile),
           **r, "x_product": r["us"] / product_us}  # fmt: skip
    print(f"  {shape.name:18s} T={num_tokens} {variant:28s} {r['us']:8.1f} us "
          f"{row['x_product']:6.3f}x  rel diff {r['max_rel_diff']:.3g}", flush=True)  # fmt: skip
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("ws_probe.py needs a CUDA GPU", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    rows, product = [], {}
    # Everything without warp specialization first: a fault in a specialized kernel ends
    # the process, and what was measured before it is already printed (and in the log).
    for name, n in CASES:
        case = _setup(name, n)
        us, reference = _product(case)
        product[name] = (us, reference)
        rows.append(_row(case, "product (tuned tile)", case[2].gemm2, {"us": us, "max_rel_diff": 0.0}, us))  # fmt: skip
        for tile in PROBE_TILES:
            rows.append(_row(case, "probe persistent", tile, _time_probe(case, tile, False, reference), us))  # fmt: skip
        del case
    (args.out / "ws_probe.json").write_text(json.dumps({**run_info(), "rows": rows}, indent=1))
    for name, n in CASES:
        case = _setup(name, n)
        us, reference = product[name]
        for tile in PROBE_TILES:
            rows.append(_row(case, "probe warp-specialized", tile, _time_probe(case, tile, True, reference), us))  # fmt: skip
            (args.out / "ws_probe.json").write_text(
                json.dumps({**run_info(), "rows": rows}, indent=1)
            )
        del case
    print(
        f"\n{'model':18s} {'T':>5s} {'variant':28s} {'tile':16s} {'us':>8s} {'x prod':>7s} {'rel diff':>9s}"
    )
    for r in rows:
        print(f"{r['model']:18s} {r['tokens']:5d} {r['variant']:28s} {r['tile'][:16]:16s} "
              f"{r['us']:8.1f} {r['x_product']:7.3f} {r['max_rel_diff']:9.3g}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
