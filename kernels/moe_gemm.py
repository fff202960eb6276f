"""The grouped GEMM of the fused MoE, over expert pages or over contiguous expert stacks.

Shape key: P = pairs (T*K), D = hidden, I = expert intermediate, E = experts, BM/BN/BK = tile.

One kernel serves both GEMMs of an expert MLP:

    gemm1: h[p, half*I + n] = x[p // K] . W[n]      W = w1 page (half 0) or w3 page (half 1), [I, D]
    gemm2: y[p, d] = w_p * (silu(h[p, :I]) * h[p, I:]) . w2[d]            w2 page [D, I]

Output tiles never straddle the gate/up boundary: gemm1's grid has cdiv(I, BN) column tiles
per half, and the half picks the matrix. Where the matrix lies is resolved once per output
tile:

    PAGED:      page = expert_table[e, FIRST_COLUMN + half]
                page >= 0 -> pool_pages base + page * page_elems
                page <  0 -> buffer_pages base + (-page - 1) * page_elems   (loading buffer)
    contiguous: stack base + e * expert_stride + half * I * D               (w13 [E, 2I, D], w2 [E, D, I])

so the paged kernel and its contiguous twin run the same instructions apart from that base.
Only experts that own a block are looked up, so table rows of unrouted experts may hold
anything. SiLU(gate)*up is fused into gemm2's operand load (no separate activation pass).
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from rimuru.kernels.moe_align import MoeAlignment
from rimuru.kernels.moe_configs import GemmTile


@triton.jit
def _silu(x):
    return x / (1.0 + tl.exp(-x))


@triton.jit(do_not_specialize=["num_pairs", "top_k"])
def _moe_gemm_kernel(
    a_ptr,  # gemm1: x [T, D]; gemm2: h [P, 2I]
    pool_ptr,  # PAGED: pool pages [*, page_elems]; else the expert stack
    buffer_ptr,  # PAGED: loading-buffer slots [*, page_elems]
    out_ptr,  # gemm1: h [P, 2I]; gemm2: y [P, D]
    topk_weights_ptr,  # [P] fp32
    sorted_ptr,
    block_expert_ptr,
    num_padded_ptr,
    expert_table_ptr,  # [E, 3] int32
    num_pairs,
    top_k,
    N,  # output columns per half
    K,  # reduction length
    stride_am,
    stride_om,
    page_elems,
    expert_stride,
    num_m_blocks,
    FIRST_COLUMN: tl.constexpr,
    NUM_HALVES: tl.constexpr,
    PAGED: tl.constexpr,
    GATHER_TOKENS: tl.constexpr,
    SWIGLU_INPUT: tl.constexpr,
    MUL_ROUTING_WEIGHT: tl.constexpr,
    EVEN_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    tiles_per_half = tl.cdiv(N, BLOCK_N)
    num_n = NUM_HALVES * tiles_per_half
    # Grouped order: GROUP_M row blocks sweep the same weight columns while they sit in L2.
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    group_size = tl.minimum(num_m_blocks - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % group_size
    pid_n = (pid % group) // group_size
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    pair = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))  # [BM]
    row_mask = pair < num_pairs
    half = pid_n // tiles_per_half
    cols = (pid_n % tiles_per_half) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN] inside the half
    col_mask = cols < N

    if PAGED:
        page = tl.load(expert_table_ptr + expert * 3 + FIRST_COLUMN + half)
        if page >= 0:
            w_ptr = pool_ptr + page.to(tl.int64) * page_elems
        else:
            w_ptr = buffer_ptr + (-1 - page).to(tl.int64) * page_elems
    else:
        w_ptr = pool_ptr + expert * expert_stride + half.to(tl.int64) * N * K

    if GATHER_TOKENS:
        a_rows = pair // top_k
    else:
        a_rows = pair
    k_offs = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_rows.to(tl.int64)[:, None] * stride_am + k_offs[None, :]  # [BM, BK]
    b_ptrs = w_ptr + cols.to(tl.int64)[None, :] * K + k_offs[:, None]  # [BK, BN]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a_mask = row_mask[:, None]
            b_mask = col_mask[None, :]
        else:
            k_left = K - k * BLOCK_K
            a_mask = row_mask[:, None] & (k_offs[None, :] < k_left)
            b_mask = col_mask[None, :] & (k_offs[:, None] < k_left)
        a = tl.load(a_ptrs, mask=a_mask, other=0.0)
        if SWIGLU_INPUT:
            up = tl.load(a_ptrs + K, mask=a_mask, other=0.0)
            a = (_silu(a.to(tl.float32)) * up.to(tl.float32)).to(up.dtype)
        b = tl.load(b_ptrs, mask=b_mask, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K

    if MUL_ROUTING_WEIGHT:
        weight = tl.load(topk_weights_ptr + pair, mask=row_mask, other=0.0)
        acc = acc * weight[:, None]
    out_cols = half * N + cols
    out_ptrs = out_ptr + pair.to(tl.int64)[:, None] * stride_om + out_cols[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & col_mask[None, :])


@dataclass(frozen=True)
class WeightSource:
    """Where one GEMM finds its expert matrices.

    Paged: ``primary`` = pool pages [num_pages, page_elems], ``buffer`` = loading-buffer
    slots, ``expert_table`` = [E, 3] int32. Contiguous: ``primary`` = the stack
    ([E, 2I, D] or [E, D, I]); ``buffer`` is ``primary`` and ``expert_table`` is None.
    """

    primary: torch.Tensor
    buffer: torch.Tensor
    expert_table: torch.Tensor | None
    page_elems: int  # elements between two pages (paged only)
    expert_stride: int  # elements between two experts of the stack (contiguous only)

    @property
    def paged(self) -> bool:
        return self.expert_table is not None


def launch_moe_gemm(
    a: torch.Tensor,
    out: torch.Tensor,
    weights: WeightSource,
    align: MoeAlignment,
    topk_weights: torch.Tensor,
    tile: GemmTile,
    *,
    n: int,
    k: int,
    top_k: int,
    first_column: int,
    num_halves: int,
    gather_tokens: bool,
    swiglu_input: bool,
    mul_routing_weight: bool,
) -> None:
    """Run one GEMM of the fused MoE. Callers (fused_moe.py) have checked every tensor."""
    num_n = num_halves * triton.cdiv(n, tile.block_n)
    grid = (align.max_blocks * num_n,)
    table = weights.expert_table if weights.paged else align.block_expert_ids
    precision = "ieee" if a.dtype == torch.float32 else "tf32"
    _moe_gemm_kernel[grid](
        a, weights.primary, weights.buffer, out, topk_weights,
        align.sorted_pair_ids, align.block_expert_ids, align.num_padded, table,
        align.num_pairs, top_k, n, k, a.stride(0), out.stride(0),
        weights.page_elems, weights.expert_stride, align.max_blocks,
        FIRST_COLUMN=first_column, NUM_HALVES=num_halves, PAGED=weights.paged,
        GATHER_TOKENS=gather_tokens, SWIGLU_INPUT=swiglu_input,
        MUL_ROUTING_WEIGHT=mul_routing_weight, EVEN_K=k % tile.block_k == 0,
        DOT_PRECISION=precision, BLOCK_M=align.block_m, BLOCK_N=tile.block_n,
        BLOCK_K=tile.block_k, GROUP_M=tile.group_m,
        num_warps=tile.num_warps, num_stages=tile.num_stages,
    )  # fmt: skip


def launch_up_gemm(x, h, source, align, topk_weights, tile, *, inter_size: int, top_k: int):
    """gemm1: h [P, 2I] = [x w1^T | x w3^T] for every pair's token."""
    launch_moe_gemm(
        x, h, source, align, topk_weights, tile,
        n=inter_size, k=x.shape[1], top_k=top_k, first_column=0, num_halves=2,
        gather_tokens=True, swiglu_input=False, mul_routing_weight=False,
    )  # fmt: skip


def launch_down_gemm(h, y, source, align, topk_weights, tile, *, inter_size: int, top_k: int):
    """gemm2: y [P, D] = weight * (silu(h[:, :I]) * h[:, I:]) w2^T."""
    launch_moe_gemm(
        h, y, source, align, topk_weights, tile,
        n=y.shape[1], k=inter_size, top_k=top_k, first_column=2, num_halves=1,
        gather_tokens=False, swiglu_input=True, mul_routing_weight=True,
    )  # fmt: skip
