"""The two grouped GEMMs of the fused MoE, over expert pages or over contiguous expert stacks.

Shape key: P = pairs (T*K), R = rows of the alignment (max_blocks * BM, a pair or padding
each, in expert-sorted order), D = hidden, I = expert intermediate, E = experts,
BM/BN/BK = tile.

    up   (gemm1): act[r, n] = silu(x[p // K] . w1[n]) * (x[p // K] . w3[n])     act [R, I]
    down (gemm2): y[p, d]   = weight[p] * act[r] . w2[d]                        y   [P, D]

where p = sorted_pair_ids[r]. The intermediate lives in *sorted* row order: the up GEMM
writes its tile's rows where they are (padding rows get zeros, since their x rows load as
0, or are copied as 0 when presorted), so the down GEMM reads a plain [BM, BK] block per step instead of gathering rows; only
its store scatters rows back to pair order for the top-k sum. What a padding row of the
intermediate holds (zeros, or nothing written under a tail tile) never reaches the output:
a product's row depends only on its own input row, and the down GEMM masks padding rows at
its store.

Tail tiles (GemmTile.tail): an expert's last block is padded up to BM, on average half a
block per expert. A block whose pairs fit in BM/2 (or BM/4) rows computes a tile of that
many rows, in the same launch (the kernel branches per program on the block's pair count).

The up GEMM's output is the 2I-wide [gate | up] product, and a program's tile is column
block n..n+BN of it in *both* halves: the gate half reads the w1 page, the up half reads
the w3 page, each through its own base pointer (never concatenated); the two accumulators
meet in the epilogue, where SiLU(gate)*up is applied before the one store.

Where a matrix lies is resolved once per output tile:

    PAGED:      page = block_pages[block, j]        (j = 0 w1, 1 w3, 2 w2; from the align step)
                page >= 0 -> pool_pages base + page * page_elems
                page <  0 -> buffer_pages base + (-page - 1) * page_elems   (loading buffer)
    contiguous: stack base + e * expert_stride (+ I*D for the up half of w13 [E, 2I, D])

so the paged kernel and its contiguous twin differ only in that base: one load of a page
id in place of one load of an expert id.

Two ways to load the tiles (GemmTile.tma): pointer loads (cp.async; any shape), or Hopper's
tensor-memory accelerator through tensor descriptors made on the device from that base,
once per tile, for the weights and for the down GEMM's intermediate. TMA needs 16-byte
aligned bases and row strides; the launcher falls back to pointer loads where they are not.
The up GEMM gathers x's rows by token, which TMA cannot (no gather on sm_90), unless the
tile presorts them (GemmTile.presort: one copy of x into sorted rows, moe_sort_rows.py).

Programs and tiles (GemmTile.schedule, moe_configs.SCHEDULES): one program per output tile
(grid), or one program per SM walking the tiles in the same grouped order (persistent),
optionally with the tile and k loops fused so the next tile's loads overlap this one's
epilogue (flattened).
"""

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from rimuru.kernels.moe_align import MoeAlignment
from rimuru.kernels.moe_configs import GemmTile
from rimuru.kernels.moe_sort_rows import sort_rows


@triton.jit
def _page_base(pool_ptr, buffer_ptr, page, page_elems):
    if page >= 0:
        base = pool_ptr + page.to(tl.int64) * page_elems
    else:
        base = buffer_ptr + (-1 - page).to(tl.int64) * page_elems
    return base


@triton.jit
def _gemm_tile(
    a_ptr, out_ptr, topk_weights_ptr, sorted_ptr, w_ptr, w3_ptr,
    num_pairs, top_k, N, K, stride_am, stride_om, a_num_rows, pid_m, pid_n,
    UP: tl.constexpr, GATHER: tl.constexpr, EVEN_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
    USE_TMA: tl.constexpr, BLOCK_M: tl.constexpr, SUB_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    """One output tile: the first SUB_M rows of row block pid_m (the rest are padding) by
    column block pid_n."""
    rows = pid_m * BLOCK_M + tl.arange(0, SUB_M)  # [SUB_M] sorted rows of this tile
    pair = tl.load(sorted_ptr + rows)  # [SUB_M]; num_pairs marks padding
    row_mask = pair < num_pairs
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    col_mask = cols < N
    k_offs = tl.arange(0, BLOCK_K)
    if GATHER:  # gather the x row of each pair's token
        a_ptrs = a_ptr + (pair // top_k).to(tl.int64)[:, None] * stride_am + k_offs[None, :]
    else:  # a is already in sorted row order (the intermediate, or sorted x): a plain block
        a_ptrs = a_ptr + rows.to(tl.int64)[:, None] * stride_am + k_offs[None, :]
    if USE_TMA:
        b_desc = tl.make_tensor_descriptor(
            w_ptr, shape=[N, K], strides=[K, 1], block_shape=[BLOCK_N, BLOCK_K]
        )
        if UP:
            b3_desc = tl.make_tensor_descriptor(
                w3_ptr, shape=[N, K], strides=[K, 1], block_shape=[BLOCK_N, BLOCK_K]
            )
        if not GATHER:
            a_desc = tl.make_tensor_descriptor(
                a_ptr, shape=[a_num_rows, K], strides=[stride_am, 1], block_shape=[SUB_M, BLOCK_K]
            )
    else:
        b_offs = cols.to(tl.int64)[None, :] * K + k_offs[:, None]  # [BK, BN] of an [N, K] matrix
        b_ptrs = w_ptr + b_offs
        if UP:
            b3_ptrs = w3_ptr + b_offs
    acc = tl.zeros((SUB_M, BLOCK_N), dtype=tl.float32)
    if UP:
        acc3 = tl.zeros((SUB_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a_mask = row_mask[:, None]
            b_mask = col_mask[None, :]
        else:
            k_left = K - k * BLOCK_K
            a_mask = row_mask[:, None] & (k_offs[None, :] < k_left)
            b_mask = col_mask[None, :] & (k_offs[:, None] < k_left)
        if USE_TMA and not GATHER:
            a = a_desc.load([pid_m * BLOCK_M, k * BLOCK_K])
        else:
            a = tl.load(a_ptrs, mask=a_mask, other=0.0)
        if USE_TMA:  # out-of-range columns and k load as zeros
            b = b_desc.load([pid_n * BLOCK_N, k * BLOCK_K]).T
        else:
            b = tl.load(b_ptrs, mask=b_mask, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        if UP:
            if USE_TMA:
                b3 = b3_desc.load([pid_n * BLOCK_N, k * BLOCK_K]).T
            else:
                b3 = tl.load(b3_ptrs, mask=b_mask, other=0.0)
                b3_ptrs += BLOCK_K
            acc3 = tl.dot(a, b3, acc3, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K
        if not USE_TMA:
            b_ptrs += BLOCK_K

    if UP:
        acc = acc / (1.0 + tl.exp(-acc)) * acc3  # SiLU(gate) * up; padding rows give 0
        out_ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_om + cols[None, :]
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=col_mask[None, :])
    else:
        weight = tl.load(topk_weights_ptr + pair, mask=row_mask, other=0.0)
        acc = acc * weight[:, None]
        out_ptrs = out_ptr + pair.to(tl.int64)[:, None] * stride_om + cols[None, :]
        tl.store(
            out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & col_mask[None, :]
        )


@triton.jit
def _grouped_tile(tile, num_m_blocks, N, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(row block, column block) of output tile number `tile`, in grouped order: GROUP_M
    row blocks sweep the same weight columns while they sit in L2."""
    num_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n
    first_m = (tile // group) * GROUP_M
    group_size = tl.minimum(num_m_blocks - first_m, GROUP_M)
    return first_m + (tile % group) % group_size, (tile % group) // group_size


@triton.jit
def _output_tile(
    pid_m, pid_n, a_ptr, pool_ptr, buffer_ptr, out_ptr, topk_weights_ptr, sorted_ptr,
    block_expert_ptr, block_pages_ptr, num_pairs, top_k, N, K, stride_am, stride_om, page_elems,
    expert_stride, a_num_rows,
    PAGE_COLUMN: tl.constexpr, PAGED: tl.constexpr, UP: tl.constexpr, GATHER: tl.constexpr,
    EVEN_K: tl.constexpr, DOT_PRECISION: tl.constexpr, USE_TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, TAIL: tl.constexpr,
):  # fmt: skip
    """The output tile of row block pid_m (one expert's, filled by the alignment) by column
    block pid_n: find the expert's matrices, then compute as many rows as the tail allows."""
    if PAGED:
        w_ptr = _page_base(
            pool_ptr, buffer_ptr, tl.load(block_pages_ptr + pid_m * 3 + PAGE_COLUMN), page_elems
        )
        w3_ptr = w_ptr
        if UP:
            w3_ptr = _page_base(
                pool_ptr, buffer_ptr, tl.load(block_pages_ptr + pid_m * 3 + 1), page_elems
            )
    else:
        expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
        w_ptr = pool_ptr + expert * expert_stride
        w3_ptr = w_ptr + N * K  # up: w13 [E, 2I, D], the up rows follow the gate rows
    # Tail tiles: an expert's pairs fill its blocks from the first row and pad the last
    # one, so a last block holding at most BLOCK_M / 2 (or / 4) pairs computes only that
    # many rows. Padding is compute the GEMM throws away (1.24x the pairs at BLOCK_M = 128
    # for Qwen3 at 4096 tokens, 1.06x with both halvings), while the weights are read once
    # per block either way. Rows past the tile are left unwritten in the up GEMM's output;
    # the down GEMM may read them (with its own tail setting) but a product's row depends
    # only on its own input row, and padding rows are masked at the down GEMM's store.
    n_rows = BLOCK_M
    if TAIL > 0:
        first = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        n_rows = tl.sum((tl.load(sorted_ptr + first) < num_pairs).to(tl.int32))
    if TAIL >= 2:  # noqa: SIM102 (a compile-time guard: the branch below must not be built)
        if n_rows <= BLOCK_M // 4:
            _gemm_tile(a_ptr, out_ptr, topk_weights_ptr, sorted_ptr, w_ptr, w3_ptr, num_pairs, top_k,
                       N, K, stride_am, stride_om, a_num_rows, pid_m, pid_n, UP, GATHER, EVEN_K,
                       DOT_PRECISION, USE_TMA, BLOCK_M, BLOCK_M // 4, BLOCK_N, BLOCK_K)  # fmt: skip
            return
    if TAIL >= 1:  # noqa: SIM102
        if n_rows <= BLOCK_M // 2:
            _gemm_tile(a_ptr, out_ptr, topk_weights_ptr, sorted_ptr, w_ptr, w3_ptr, num_pairs, top_k,
                       N, K, stride_am, stride_om, a_num_rows, pid_m, pid_n, UP, GATHER, EVEN_K,
                       DOT_PRECISION, USE_TMA, BLOCK_M, BLOCK_M // 2, BLOCK_N, BLOCK_K)  # fmt: skip
            return
    _gemm_tile(a_ptr, out_ptr, topk_weights_ptr, sorted_ptr, w_ptr, w3_ptr, num_pairs, top_k,
               N, K, stride_am, stride_om, a_num_rows, pid_m, pid_n, UP, GATHER, EVEN_K,
               DOT_PRECISION, USE_TMA, BLOCK_M, BLOCK_M, BLOCK_N, BLOCK_K)  # fmt: skip


# Ints that vary with the batch are not specialised: one compiled variant serves every batch
# (the engine compiles each variant once at start-up, dataplane/engine/startup/warmup.py).
@triton.jit(do_not_specialize=["num_pairs", "top_k", "num_m_blocks", "a_num_rows"])
def _moe_gemm_kernel(
    a_ptr,  # up: x [T, D] (or, GATHER off, its presorted rows [R, D]); down: act [R, I]
    pool_ptr,  # PAGED: pool pages [*, page_elems]; else the expert stack
    buffer_ptr,  # PAGED: loading-buffer slots [*, page_elems]
    out_ptr,  # up: act [R, I] in sorted row order; down: y [P, D]
    topk_weights_ptr,  # [P] fp32
    sorted_ptr,
    block_expert_ptr,
    block_pages_ptr,  # [NB, 3] int32 (PAGED)
    num_padded_ptr,
    num_pairs,
    top_k,
    N,  # output columns
    K,  # reduction length
    stride_am,
    stride_om,
    page_elems,
    expert_stride,
    num_m_blocks,  # row blocks the grid was sized for (align.max_blocks)
    a_num_rows,  # rows of a (for its descriptor where a is in sorted rows)
    PAGE_COLUMN: tl.constexpr,  # 0 for the up GEMM (w1, and w3 next to it), 2 for down (w2)
    PAGED: tl.constexpr,
    UP: tl.constexpr,  # two accumulators (w1 and w3), SiLU(gate)*up epilogue
    GATHER: tl.constexpr,  # UP: a is x [T, D], rows gathered by token (else sorted rows)
    EVEN_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    USE_TMA: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    TAIL: tl.constexpr,  # halvings of BLOCK_M a block with few pairs may take (0, 1 or 2)
    PERSISTENT: tl.constexpr,  # one program per SM walks the tiles (else one tile a program)
    FLATTEN: tl.constexpr,  # PERSISTENT: fuse the tile loop with the k loop (moe_configs.py)
):
    if PERSISTENT:
        # Only the blocks the alignment filled, read on the device: the grid was sized
        # without knowing them.
        num_m = tl.load(num_padded_ptr) // BLOCK_M
        num_tiles = num_m * tl.cdiv(N, BLOCK_N)
        for tile in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0), flatten=FLATTEN):
            pid_m, pid_n = _grouped_tile(tile, num_m, N, BLOCK_N, GROUP_M)
            _output_tile(pid_m, pid_n, a_ptr, pool_ptr, buffer_ptr, out_ptr, topk_weights_ptr,
                         sorted_ptr, block_expert_ptr, block_pages_ptr, num_pairs, top_k, N, K,
                         stride_am, stride_om, page_elems, expert_stride, a_num_rows, PAGE_COLUMN,
                         PAGED, UP, GATHER, EVEN_K, DOT_PRECISION, USE_TMA, BLOCK_M, BLOCK_N, BLOCK_K,
                         TAIL)  # fmt: skip
    else:
        pid_m, pid_n = _grouped_tile(tl.program_id(0), num_m_blocks, N, BLOCK_N, GROUP_M)
        if pid_m * BLOCK_M < tl.load(num_padded_ptr):
            _output_tile(pid_m, pid_n, a_ptr, pool_ptr, buffer_ptr, out_ptr, topk_weights_ptr,
                         sorted_ptr, block_expert_ptr, block_pages_ptr, num_pairs, top_k, N, K,
                         stride_am, stride_om, page_elems, expert_stride, a_num_rows, PAGE_COLUMN,
                         PAGED, UP, GATHER, EVEN_K, DOT_PRECISION, USE_TMA, BLOCK_M, BLOCK_N, BLOCK_K,
                         TAIL)  # fmt: skip


@dataclass(frozen=True)
class WeightSource:
    """Where the GEMMs find the expert matrices.

    Paged: ``primary`` = pool pages [num_pages, page_elems], ``buffer`` = loading-buffer
    slots, and the alignment carries ``block_pages``. Contiguous: ``primary`` = the stack
    ([E, 2I, D] for up, [E, D, I] for down) and ``buffer`` is ``primary``.
    """

    primary: torch.Tensor
    buffer: torch.Tensor
    paged: bool
    page_elems: int  # elements between two pages (paged only)
    expert_stride: int  # elements between two experts of the stack (contiguous only)


def _tma_scratch(size: int, alignment: int, stream) -> torch.Tensor:
    """Global scratch where device-made tensor descriptors live (128 bytes per program).

    Triton calls this at launch, on the current device, which is also where it launches the
    kernel: callers with tensors on another GPU must make it current first (the engine does).
    `triton.set_allocator` is process-wide; this one replaces any allocator set before."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.empty(size, dtype=torch.int8, device=device)


def _tma_ok(
    a: torch.Tensor, source: WeightSource, *, n: int, k: int, up: bool, gather: bool
) -> bool:
    """Whether every descriptor base and row stride is 16-byte aligned (TMA's rule)."""
    size = a.element_size()
    bases = [source.primary, source.buffer] + ([] if gather else [a])
    steps = [k, source.page_elems if source.paged else source.expert_stride]
    if up and not source.paged:
        steps.append(n * k)  # the up half of w13 starts I*D elements after the gate half
    if not gather:
        steps.append(a.stride(0))
    return all(t.data_ptr() % 16 == 0 for t in bases) and all(s * size % 16 == 0 for s in steps)


def _grid_size(num_tiles: int, schedule: str, device: torch.device) -> int:
    """Programs to launch: one per output tile, or (persistent schedules) at most one per SM.
    The interpreter (CPU) stands for 3 SMs, so tests walk several tiles per program,
    including programs that get one tile fewer."""
    if schedule == "grid":
        return num_tiles
    if device.type != "cuda":
        return min(num_tiles, 3)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return min(num_tiles, _num_sms(index))


@functools.cache
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _launch(a, out, source: WeightSource, align: MoeAlignment, topk_weights, tile: GemmTile,
            *, n: int, k: int, top_k: int, up: bool) -> None:  # fmt: skip
    if source.paged and align.block_pages is None:
        raise ValueError("a paged GEMM needs the alignment built with expert_table")
    if tile.tail and align.block_m >> tile.tail < 16:
        raise ValueError(
            f"tail={tile.tail} halves block_m={align.block_m} below 16 rows, the smallest dot tile"
        )
    if tile.presort and not up:
        raise ValueError("presort is for the up GEMM; the down GEMM reads sorted rows anyway")
    gather = up and not tile.presort
    if up and tile.presort:
        a = sort_rows(a, align, top_k)  # [R, D] in sorted row order
    use_tma = tile.tma and _tma_ok(a, source, n=n, k=k, up=up, gather=gather)
    if use_tma:
        triton.set_allocator(_tma_scratch)
    num_tiles = align.max_blocks * triton.cdiv(n, tile.block_n)
    grid = (_grid_size(num_tiles, tile.schedule, a.device),)
    pages = align.block_pages if source.paged else align.block_expert_ids
    _moe_gemm_kernel[grid](
        a, source.primary, source.buffer, out, topk_weights,
        align.sorted_pair_ids, align.block_expert_ids, pages, align.num_padded,
        align.num_pairs, top_k, n, k, a.stride(0), out.stride(0),
        source.page_elems, source.expert_stride, align.max_blocks, a.shape[0],
        PAGE_COLUMN=0 if up else 2, PAGED=source.paged, UP=up, GATHER=gather,
        EVEN_K=k % tile.block_k == 0,
        DOT_PRECISION="ieee" if a.dtype == torch.float32 else "tf32", USE_TMA=use_tma,
        BLOCK_M=align.block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, GROUP_M=tile.group_m,
        TAIL=tile.tail, PERSISTENT=tile.schedule != "grid", FLATTEN=tile.schedule == "flattened",
        num_warps=tile.num_warps, num_stages=tile.num_stages,
    )  # fmt: skip


def launch_up_gemm(x, act, source, align, topk_weights, tile, *, inter_size: int, top_k: int):
    """act [R, I] (R = align.max_blocks * block_m, sorted rows) = silu(x w1^T) * (x w3^T) for every pair's token. Callers check tensors."""
    _launch(
        x, act, source, align, topk_weights, tile, n=inter_size, k=x.shape[1], top_k=top_k, up=True
    )


def launch_down_gemm(act, y, source, align, topk_weights, tile, *, inter_size: int, top_k: int):
    """y [P, D] = weight * act w2^T, act in sorted rows as the up GEMM wrote it. Callers check
    tensors."""
    _launch(
        act, y, source, align, topk_weights, tile, n=y.shape[1], k=inter_size, top_k=top_k, up=False
    )
