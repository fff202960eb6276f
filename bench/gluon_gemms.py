"""Warp-specialized grouped GEMMs of the fused MoE in Gluon: probes, not yet run on a GPU.

Shape key: R = rows of the alignment (sorted pairs and padding), D = hidden, I = expert
intermediate, E = experts, P = pairs; BM/BN/BK = tile.

    down: y[p] = w[p] * act[r] . w2[e]^T           act [R, I] sorted rows -> y [P, D]
    up:   act[r] = silu(xs[r] . w1[e]^T) * (xs[r] . w3[e]^T)   xs [R, D] = x's rows, presorted
                                                                (kernels/moe_sort_rows.py)

Triton 3.6's automatic warp specialization faulted or hung on the product's grouped GEMM
(docs/benchmarks.md); Gluon (`triton.experimental.gluon`, in the same triton package) states
it by hand. Each kernel is one persistent program per SM in two partitions:

    loader (1 warp)                        MMA (one or two warpgroups)
    for each tile, each k step:            for each tile:
      wait empty[s]  (slot s is free)        for each k step:
      expect ready[s]; TMA loads ->            wait ready[s]; wgmma; free a slot whose
                                               wgmma is done (this one, or the previous one
                                               with one wgmma left in flight)
                                             epilogue: store the tile

so TMA loads for the next stages (and the next tile) run while the tensor cores work and
while the epilogue stores. Weights are read through host-made descriptors over each store as
rows of K (the stack as [E*N, K], the pool as [pages * page_elems / K, K], the loading buffer
likewise); the loader picks the pool's or the buffer's per block by the page's sign, as the
product kernel picks a base (kernels/moe_gemm.py). Tiles follow the product's grouped order.

Checked on a machine without a GPU: both compile for sm_90 (tests/bench/test_gluon_probe.py
reads their PTX). Not checked: that they run, that the barrier phases are right, speed.
"""

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

from rimuru.kernels.moe_align import MoeAlignment
from rimuru.kernels.moe_gemm import WeightSource
from rimuru.kernels.moe_sort_rows import sort_rows

# (block_n, block_k, stages, wgmma groups left in flight, warps of the MMA partition),
# block_m from the alignment (128). A 128 x 256 fp32 accumulator needs two warpgroups: on one
# it spills and ptxas serializes the wgmmas (seen in `ptxas -v` for sm_90).
DOWN_TILES = [(128, 64, 4, 0, 4), (128, 64, 4, 1, 4), (256, 64, 3, 0, 8), (256, 64, 3, 1, 8)]


@gluon.jit
def _tile_coords(tile, num_m, num_n, GROUP_M: gl.constexpr):
    """(row block, column block) of tile number `tile`, in the product kernel's grouped order."""
    group = GROUP_M * num_n
    first_m = (tile // group) * GROUP_M
    size = gl.minimum(num_m - first_m, GROUP_M)
    return first_m + (tile % group) % size, (tile % group) // size


@gluon.jit
def _counts(num_padded_ptr, N, K, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
            BLOCK_K: gl.constexpr):  # fmt: skip
    """Row blocks the alignment filled (read on the device), column blocks, k steps."""
    return gl.load(num_padded_ptr) // BLOCK_M, gl.cdiv(N, BLOCK_N), gl.cdiv(K, BLOCK_K)


@gluon.jit
def _slot_barriers(STAGES: gl.constexpr):
    """Per slot of the ring: ready (the loader's TMA bytes landed) and empty (the MMA
    partition is done reading it), one arrival each."""
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    fence_async_shared()
    return ready, empty


@gluon.jit
def _loader(
    a_desc, w_desc, buf_desc, a_bufs, b_bufs, ready, empty, pages_ptr, page_stride,
    rows_per_page, num_padded_ptr, N, K,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr,
    STAGES: gl.constexpr, PAGE_COLUMN: gl.constexpr,
):  # fmt: skip
    num_m, num_n, num_k = _counts(num_padded_ptr, N, K, BLOCK_M, BLOCK_N, BLOCK_K)
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
    num_m, num_n, num_k = _counts(num_padded_ptr, N, K, BLOCK_M, BLOCK_N, BLOCK_K)
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
    ready, empty = _slot_barriers(STAGES)
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
    """Host-made TMA descriptors: the A operand [R, K] (act for down, sorted x for up) by
    [block_m, block_k], then each weight store (the stack, the pool, the loading buffer) as
    rows of K by [block_n, block_k]."""
    block_n, block_k = tile[:2]
    row_len = act.shape[1]
    a_layout = gl.NVMMASharedLayout.get_default_for([block_m, block_k], gl.bfloat16)
    w_layout = gl.NVMMASharedLayout.get_default_for([block_n, block_k], gl.bfloat16)
    return [TensorDescriptor.from_tensor(act, [block_m, block_k], a_layout)] + [
        TensorDescriptor.from_tensor(w.reshape(-1, row_len), [block_n, block_k], w_layout)
        for w in weights
    ]


def launch_down(
    act, y, weights, align: MoeAlignment, source: WeightSource, tile, num_sms: int
) -> None:
    """y = the down GEMM over source's matrices (the product's WeightSource)."""
    block_n, block_k, stages, in_flight, num_warps = tile
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
        NUM_WARPS=num_warps, MMA_IN_FLIGHT=in_flight, PAGE_COLUMN=column, num_warps=num_warps,
    )  # fmt: skip


# Up GEMM: (block_n, block_k, stages, warps of the MMA partition). Two accumulators (gate and
# up) of BM x BN fp32: 64-wide with one warpgroup, 128-wide with two (64 rows each).
UP_TILES = [(64, 64, 4, 4), (128, 64, 3, 8)]


@gluon.jit
def _page_row(pages_ptr, offset, rows_per_page, extra):
    """(the matrix's first row in its store, in the pool?, in the loading buffer?)."""
    page = gl.load(pages_ptr + offset)
    index = page
    if page < 0:
        index = -1 - page
    return index * rows_per_page + extra, page >= 0, page < 0


@gluon.jit
def _up_loader(
    a_desc, w_desc, buf_desc, a_bufs, b1_bufs, b3_bufs, ready, empty, pages_ptr, rows_per_page,
    up_offset, num_padded_ptr, N, K,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr,
    STAGES: gl.constexpr, PAGED: gl.constexpr,
):  # fmt: skip
    num_m, num_n, num_k = _counts(num_padded_ptr, N, K, BLOCK_M, BLOCK_N, BLOCK_K)
    step = 0
    for tile in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        pid_m, pid_n = _tile_coords(tile, num_m, num_n, GROUP_M)
        if PAGED:  # w1 and w3 on their own pages (block_pages columns 0 and 1)
            row1, pool1, buf1 = _page_row(pages_ptr, pid_m * 3, rows_per_page, 0)
            row3, pool3, buf3 = _page_row(pages_ptr, pid_m * 3 + 1, rows_per_page, 0)
        else:  # the expert's [2I, D] slice of the stack: w1 rows, then w3 rows
            row1, pool1, buf1 = _page_row(pages_ptr, pid_m, rows_per_page, 0)
            row3, pool3, buf3 = _page_row(pages_ptr, pid_m, rows_per_page, up_offset)
        row1 += pid_n * BLOCK_N
        row3 += pid_n * BLOCK_N
        for k in range(num_k):
            slot = step % STAGES
            mbarrier.wait(empty.index(slot), ((step // STAGES) & 1) ^ 1)
            mbarrier.expect(
                ready.index(slot), a_desc.block_type.nbytes + 2 * w_desc.block_type.nbytes
            )
            bar = ready.index(slot)
            tma.async_copy_global_to_shared(
                a_desc, [pid_m * BLOCK_M, k * BLOCK_K], bar, a_bufs.index(slot)
            )
            col = k * BLOCK_K
            tma.async_copy_global_to_shared(
                w_desc, [row1, col], bar, b1_bufs.index(slot), pred=pool1
            )
            tma.async_copy_global_to_shared(
                buf_desc, [row1, col], bar, b1_bufs.index(slot), pred=buf1
            )
            tma.async_copy_global_to_shared(
                w_desc, [row3, col], bar, b3_bufs.index(slot), pred=pool3
            )
            tma.async_copy_global_to_shared(
                buf_desc, [row3, col], bar, b3_bufs.index(slot), pred=buf3
            )
            step += 1


@gluon.jit
def _up_mma_and_store(
    a_bufs, b1_bufs, b3_bufs, ready, empty, act_ptr, num_padded_ptr, N, K, stride_act,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr,
    STAGES: gl.constexpr, NUM_WARPS: gl.constexpr,
):  # fmt: skip
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[NUM_WARPS, 1], instr_shape=[16, BLOCK_N, 16]
    )
    num_m, num_n, num_k = _counts(num_padded_ptr, N, K, BLOCK_M, BLOCK_N, BLOCK_K)
    step = 0
    for tile in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        pid_m, pid_n = _tile_coords(tile, num_m, num_n, GROUP_M)
        gate = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=acc_layout)
        up = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=acc_layout)
        for _k in range(num_k):
            slot = step % STAGES
            mbarrier.wait(ready.index(slot), (step // STAGES) & 1)
            a = a_bufs.index(slot)
            gate = warpgroup_mma(a, b1_bufs.index(slot).permute((1, 0)), gate, is_async=True)
            up = warpgroup_mma(a, b3_bufs.index(slot).permute((1, 0)), up, is_async=True)
            gate, up = warpgroup_mma_wait(num_outstanding=0, deps=[gate, up])
            mbarrier.arrive(empty.index(slot), count=1)
            step += 1
        out = gate / (1.0 + gl.exp(-gate)) * up  # SiLU(gate) * up; padding rows (x = 0) give 0
        rows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc_layout))
        cols = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, acc_layout))
        offs = gl.expand_dims(rows.to(gl.int64) * stride_act, 1) + gl.expand_dims(cols, 0)
        mask = gl.expand_dims(rows >= 0, 1) & gl.expand_dims(cols < N, 0)
        gl.store(act_ptr + offs, out.to(act_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def gluon_up_kernel(
    a_desc, w_desc, buf_desc, act_ptr, pages_ptr, rows_per_page, up_offset, num_padded_ptr,
    N, K, stride_act,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr,
    STAGES: gl.constexpr, NUM_WARPS: gl.constexpr, PAGED: gl.constexpr,
):  # fmt: skip
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
    b1_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], w_desc.layout)
    b3_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], w_desc.layout)
    ready, empty = _slot_barriers(STAGES)
    gl.warp_specialize(
        [
            (_up_mma_and_store, (a_bufs, b1_bufs, b3_bufs, ready, empty, act_ptr,
                                 num_padded_ptr, N, K, stride_act, BLOCK_M, BLOCK_N, BLOCK_K,
                                 GROUP_M, STAGES, NUM_WARPS)),
            (_up_loader, (a_desc, w_desc, buf_desc, a_bufs, b1_bufs, b3_bufs, ready, empty,
                          pages_ptr, rows_per_page, up_offset, num_padded_ptr, N, K, BLOCK_M,
                          BLOCK_N, BLOCK_K, GROUP_M, STAGES, PAGED)),
        ],
        [1],
        [40],
    )  # fmt: skip


def launch_up(x, act, align: MoeAlignment, source: WeightSource, tile, num_sms: int, top_k: int):
    """act [R, I] = the up GEMM over source's matrices, x's rows presorted first."""
    block_n, block_k, stages, num_warps = tile
    hidden, inter = x.shape[1], act.shape[1]
    xs = sort_rows(x, align, top_k)  # [R, D], zeros in padding rows
    if source.paged:
        if source.page_elems % hidden:
            raise ValueError("a page must hold whole rows of D elements")
        stores, pages = [source.primary, source.buffer], align.block_pages
        rows_per_page, up_offset = source.page_elems // hidden, 0
    else:  # w13 [E, 2I, D]
        stores, pages = [source.primary] * 2, align.block_expert_ids
        rows_per_page, up_offset = 2 * inter, inter
    a_desc, w_desc, buf_desc = descriptors(xs, stores, align.block_m, tile)
    grid = (min(num_sms, align.max_blocks * triton.cdiv(inter, block_n)),)
    gluon_up_kernel[grid](
        a_desc, w_desc, buf_desc, act, pages, rows_per_page, up_offset, align.num_padded, inter,
        hidden, act.stride(0),
        BLOCK_M=align.block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8, STAGES=stages,
        NUM_WARPS=num_warps, PAGED=source.paged, num_warps=num_warps,
    )  # fmt: skip
