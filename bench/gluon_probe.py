"""Probe (not yet run on a GPU): a warp-specialized grouped down GEMM written in Gluon.

Usage (GPU):  python bench/gluon_probe.py [--out DIR]

An experiment for issue 4's targets, not a product kernel. Triton 3.6's automatic warp
specialization faulted or hung on our grouped GEMM (docs/benchmarks.md); Gluon, shipped in
the same triton package (`triton.experimental.gluon`), states the specialization by hand:

    loader partition (1 warp)            MMA partition (4 warps, one warpgroup)
    for each tile, each k step:          for each tile:
      wait empty[s]  (slot s is free)      for each k step:
      expect ready[s], 2 TMA loads ->        wait ready[s]; wgmma; release a slot whose
                                             wgmma is done (this one, or the previous one
                                             with one wgmma left in flight)
                                           scale rows by routing weight, scatter-store

so TMA loads for the next stages (and the next tile) run while the tensor cores work and
while the epilogue stores. The GEMM is the down GEMM, y[p] = w[p] * act[r] . w2[e]^T, act in
the alignment's sorted rows, over the contiguous stack or over pool pages and loading-buffer
slots (tune_moe.py's layout): descriptors are made on the host over each store as rows of I
(the stack as [E*D, I], the pool as [pages * page_elems / I, I]), and the loader picks the
pool's or the buffer's per block, as the product kernel picks a base. Each variant runs
beside the product kernel at its tuned tile, paged and contiguous, same run, every output
checked against the product's contiguous one; the table is printed last and goes to
DIR/gluon_probe.json.

Checked here: compiles for sm_90 on a machine without a GPU. Not checked: that it runs,
that its barrier phases are right, that it is faster.
"""

import argparse
import functools
import json
import sys
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from rimuru.kernels import get_moe_config
from rimuru.kernels.moe_align import moe_align_block_size
from rimuru.kernels.moe_gemm import WeightSource, launch_down_gemm

sys.path.insert(0, str(Path(__file__).parent))

CASES = [("qwen3-30b-a3b", 4096), ("mixtral-8x7b", 1024)]
# (block_n, block_k, stages, wgmma groups left in flight), block_m from the alignment (128).
TILES = [(128, 64, 4, 0), (128, 64, 4, 1), (256, 64, 3, 0), (256, 64, 3, 1)]


@gluon.jit
def _tile_coords(tile, num_m, num_n, GROUP_M: gl.constexpr):
    """(row block, column block) of tile number `tile`, in the product kernel's grouped order."""
    group = GROUP_M * num_n
    first_m = (tile // group) * GROUP_M
    size = gl.minimum(num_m - first_m, GROUP_M)
    return first_m + (tile % group) % size, (tile % group) // size


@gluon.jit
def _loader(
    a_desc, w_desc, buf_desc, a_bufs, b_bufs, ready, empty, pages_ptr, page_stride,
    rows_per_page, num_padded_ptr, N, K,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr,
    STAGES: gl.constexpr, PAGE_COLUMN: gl.constexpr,
):  # fmt: skip
    num_m = gl.load(num_padded_ptr) // BLOCK_M
    num_n = gl.cdiv(N, BLOCK_N)
    num_k = gl.cdiv(K, BLOCK_K)
    step = 0  # k steps issued so far, over all tiles: slot = step % STAGES
    for tile in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        pid_m, pid_n = _tile_coords(tile, num_m, num_n, GROUP_M)
        # The block's w2 page, as the product kernel finds it: >= 0 a pool page, < 0 the
        # loading-buffer slot -page - 1 (contiguous: the expert id, a "page" of N rows).
        page = gl.load(pages_ptr + pid_m * page_stride + PAGE_COLUMN)
        in_pool = page >= 0
        index = page
        if page < 0:
            index = -1 - page
        row = index * rows_per_page + pid_n * BLOCK_N
        for k in range(num_k):
            slot = step % STAGES
            # A fresh barrier counts as having completed the phase before its first, so the
            # first pass over the slots does not wait.
            mbarrier.wait(empty.index(slot), ((step // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(slot), a_desc.block_type.nbytes + w_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(
                a_desc, [pid_m * BLOCK_M, k * BLOCK_K], ready.index(slot), a_bufs.index(slot)
            )
            # One of the two loads runs: the pool's descriptor or the loading buffer's.
            tma.async_copy_global_to_shared(
                w_desc, [row, k * BLOCK_K], ready.index(slot), b_bufs.index(slot), pred=in_pool
            )
            tma.async_copy_global_to_shared(
                buf_desc, [row, k * BLOCK_K], ready.index(slot), b_bufs.index(slot),
                pred=page < 0,
            )  # fmt: skip
            step += 1


@gluon.jit
def _mma_and_store(
    a_bufs, b_bufs, ready, empty, y_ptr, weights_ptr, sorted_ptr, num_padded_ptr, num_pairs,
    N, K, stride_y,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr,
    STAGES: gl.constexpr, NUM_WARPS: gl.constexpr, MMA_IN_FLIGHT: gl.constexpr,
):  # fmt: skip
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[NUM_WARPS, 1], instr_shape=[16, BLOCK_N, 16]
    )
    num_m = gl.load(num_padded_ptr) // BLOCK_M
    num_n = gl.cdiv(N, BLOCK_N)
    num_k = gl.cdiv(K, BLOCK_K)
    step = 0
    for tile in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        pid_m, pid_n = _tile_coords(tile, num_m, num_n, GROUP_M)
        acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=acc_layout)
        previous = 0
        for k in range(num_k):
            slot = step % STAGES
            mbarrier.wait(ready.index(slot), (step // STAGES) & 1)
            acc = warpgroup_mma(
                a_bufs.index(slot), b_bufs.index(slot).permute((1, 0)), acc, is_async=True
            )
            # MMA_IN_FLIGHT = 1: this step's wgmma runs while we wait for the previous one,
            # whose slot is then free for the loader; 0: wait for this one and free its slot.
            acc = warpgroup_mma_wait(num_outstanding=MMA_IN_FLIGHT, deps=[acc])
            if MMA_IN_FLIGHT == 0:
                mbarrier.arrive(empty.index(slot), count=1)
            else:
                mbarrier.arrive(empty.index(previous), count=1, pred=k > 0)
            previous = slot
            step += 1
        if MMA_IN_FLIGHT > 0:
            acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
            mbarrier.arrive(empty.index(previous), count=1)
        rows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc_layout))
        cols = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, acc_layout))
        pair = gl.load(sorted_ptr + rows)
        row_mask = pair < num_pairs
        weight = gl.load(weights_ptr + pair, mask=row_mask, other=0.0)
        out = acc * gl.expand_dims(weight, 1)
        offs = gl.expand_dims(pair.to(gl.int64) * stride_y, 1) + gl.expand_dims(cols, 0)
        mask = gl.expand_dims(row_mask, 1) & gl.expand_dims(cols < N, 0)
        gl.store(y_ptr + offs, out.to(y_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def gluon_down_kernel(
    a_desc, w_desc, buf_desc, y_ptr, weights_ptr, sorted_ptr, pages_ptr, page_stride,
    rows_per_page, num_padded_ptr, num_pairs, N, K, stride_y,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr,
    STAGES: gl.constexpr, NUM_WARPS: gl.constexpr, MMA_IN_FLIGHT: gl.constexpr,
    PAGE_COLUMN: gl.constexpr,
):  # fmt: skip
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    fence_async_shared()
    gl.warp_specialize(
        [
            (_mma_and_store, (a_bufs, b_bufs, ready, empty, y_ptr, weights_ptr, sorted_ptr,
                              num_padded_ptr, num_pairs, N, K, stride_y, BLOCK_M, BLOCK_N,
                              BLOCK_K, GROUP_M, STAGES, NUM_WARPS, MMA_IN_FLIGHT)),
            (_loader, (a_desc, w_desc, buf_desc, a_bufs, b_bufs, ready, empty, pages_ptr,
                       page_stride, rows_per_page, num_padded_ptr, N, K, BLOCK_M, BLOCK_N,
                       BLOCK_K, GROUP_M, STAGES, PAGE_COLUMN)),
        ],
        [1],  # warps of the loader
        [40],  # registers a loader thread keeps (the MMA warps get the rest)
    )  # fmt: skip


def descriptors(act: torch.Tensor, weights: list[torch.Tensor], block_m: int, tile) -> list:
    """Host-made TMA descriptors: act [R, I] by [block_m, block_k], then each weight store
    (the stack, the pool, the loading buffer) as rows of I by [block_n, block_k]."""
    block_n, block_k = tile[:2]
    inter = act.shape[1]
    a_layout = gl.NVMMASharedLayout.get_default_for([block_m, block_k], gl.bfloat16)
    w_layout = gl.NVMMASharedLayout.get_default_for([block_n, block_k], gl.bfloat16)
    return [TensorDescriptor.from_tensor(act, [block_m, block_k], a_layout)] + [
        TensorDescriptor.from_tensor(w.reshape(-1, inter), [block_n, block_k], w_layout)
        for w in weights
    ]


def launch(act, y, weights, align, source: WeightSource, tile, num_sms: int) -> None:
    """y = the down GEMM over source's matrices (the product's WeightSource)."""
    block_n, block_k, stages, in_flight = tile
    D, inter = y.shape[1], act.shape[1]
    if source.paged:
        if source.page_elems % inter:
            raise ValueError("a page must hold whole rows of I elements")
        stores, pages, stride, column = [source.primary, source.buffer], align.block_pages, 3, 2
        rows_per_page = source.page_elems // inter
    else:
        stores, pages, stride, column = [source.primary] * 2, align.block_expert_ids, 1, 0
        rows_per_page = D
    a_desc, w_desc, buf_desc = descriptors(act, stores, align.block_m, tile)
    grid = (min(num_sms, align.max_blocks * triton.cdiv(D, block_n)),)
    gluon_down_kernel[grid](
        a_desc, w_desc, buf_desc, y, weights, align.sorted_pair_ids, pages, stride,
        rows_per_page, align.num_padded, align.num_pairs, D, inter, y.stride(0),
        BLOCK_M=align.block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8, STAGES=stages,
        NUM_WARPS=4, MMA_IN_FLIGHT=in_flight, PAGE_COLUMN=column, num_warps=4,
    )  # fmt: skip


def _case(name: str, num_tokens: int):
    """tune_moe.py's experts (pool pages, a share in loading-buffer slots) and routing."""
    from tune_moe import MODELS, make_experts, random_routing

    shape = MODELS[name]
    dev = torch.device("cuda")
    experts = make_experts(shape, torch.bfloat16, dev, seed=0)
    config = get_moe_config(shape.num_experts, shape.inter_size, shape.hidden_size, num_tokens,
                            shape.top_k, torch.bfloat16, dev)  # fmt: skip
    ids, weights = random_routing(num_tokens, shape, dev, seed=num_tokens)
    align = moe_align_block_size(ids, shape.num_experts, config.block_m, experts.expert_table)
    gen = torch.Generator(device=dev).manual_seed(1)
    act = torch.randn(align.max_blocks * config.block_m, shape.inter_size, generator=gen,
                      device=dev).to(torch.bfloat16)  # fmt: skip
    sources = {"contiguous": WeightSource(experts.w2, experts.w2, False, 0, experts.w2.stride(0)),
               "paged": experts.paged_source()}  # fmt: skip
    return shape, config, align, act, weights.reshape(-1).float(), sources


def _timed(fn, y: torch.Tensor, reference: torch.Tensor | None) -> tuple[float, float]:
    from tune_moe import replay_ms

    y.fill_(float("nan"))
    fn()
    torch.cuda.synchronize()
    diff = (
        0.0
        if reference is None
        else float((y.float() - reference).abs().max() / reference.abs().max())
    )
    return replay_ms(fn, 20.0) * 1e3, diff


def main() -> int:
    from tune_moe import run_info

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gluon_probe.py needs a CUDA GPU", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for name, n in CASES:
        shape, config, align, act, weights, sources = _case(name, n)
        y = torch.empty(weights.numel(), shape.hidden_size, dtype=act.dtype, device=act.device)
        reference, base_us = None, None
        variants = [
            (
                f"product {kind}",
                functools.partial(
                    launch_down_gemm,
                    act,
                    y,
                    source,
                    align,
                    weights,
                    config.gemm2,
                    inter_size=shape.inter_size,
                    top_k=shape.top_k,
                ),
            )
            for kind, source in sources.items()
        ]
        variants += [(f"gluon {kind} {tile}", functools.partial(
            launch, act, y, weights, align, source, tile, sms))
            for tile in TILES for kind, source in sources.items()]  # fmt: skip
        for variant, fn in variants:
            us, diff = _timed(fn, y, reference)
            if reference is None:  # the product's contiguous output: what all are checked on
                reference, base_us = y.float().clone(), us
            rows.append({"model": shape.name, "tokens": n, "variant": variant, "us": us,
                         "x_product": us / base_us, "max_rel_diff": diff})  # fmt: skip
            print(f"  {shape.name:18s} T={n} {variant:36s} {us:8.1f} us {us / base_us:6.3f}x "
                  f"rel diff {diff:.3g}", flush=True)  # fmt: skip
            (args.out / "gluon_probe.json").write_text(json.dumps({**run_info(), "rows": rows}))
        del sources
        torch.cuda.empty_cache()
    print(f"\n{'model':18s} {'T':>5s} {'variant':36s} {'us':>8s} {'x prod':>7s} {'rel diff':>9s}")
    for r in rows:
        print(f"{r['model']:18s} {r['tokens']:5d} {r['variant']:36s} {r['us']:8.1f} "
              f"{r['x_product']:7.3f} {r['max_rel_diff']:9.3g}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
