"""Paged prefill attention: varlen chunks of prompts attending causally to everything cached.

Shape key: T = query tokens of all sequences, S = sequences, Hq / Hkv = query / KV heads,
Dh = head size, M = query rows per tile, N = key tokens per tile.

    paged_prefill_attention(q [T, Hq, Dh], kv_pages [P, 2, 16, Hkv, Dh],
                            block_tables [S, max_blocks] int32, cu_seqlens_q [S+1] int32,
                            seq_lens [S] int32, max_query_len: int, *, scale=None,
                            out=None) -> [T, Hq, Dh]

Sequence s owns query rows cu_seqlens_q[s] .. cu_seqlens_q[s+1]; they are the last
q_len = cu_seqlens_q[s+1] - cu_seqlens_q[s] tokens of its seq_lens[s] cached tokens, so
query i sits at position seq_lens[s] - q_len + i and sees keys 0..that position. Earlier
chunks of a chunked prompt and the current chunk are all read from the pool: write the
chunk's K/V with write_kv_pages before calling.
"""

import torch
import triton
import triton.language as tl

from rimuru.kernels.kv_pages import (
    attend_sequence_reference,
    check_block_tables,
    check_int32_vector,
    check_kv_pages,
    check_query,
    default_scale,
    dot_precision,
    load_kv_tile,
    online_softmax_step,
)

_LOG2E = 1.4426950408889634


# The block-table width varies with the batch, and a layer's table is a view that may start
# off a 16-byte boundary; so may cu_seqlens and seq_lens, views into one upload of the step's
# vectors whose offsets move with the batch: none is specialised (one variant).
@triton.jit(
    do_not_specialize=["stride_bt"],
    do_not_specialize_on_alignment=["block_tables_ptr", "cu_seqlens_ptr", "seq_lens_ptr"],
)
def _prefill_kernel(
    q_ptr,
    kv_ptr,
    block_tables_ptr,
    cu_seqlens_ptr,
    seq_lens_ptr,
    out_ptr,
    scale_log2,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_bt,
    stride_page,
    stride_kind,
    stride_tok,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    seq = tl.program_id(0)
    q_block = tl.program_id(1)
    head = tl.program_id(2)
    q_start = tl.load(cu_seqlens_ptr + seq)
    q_len = tl.load(cu_seqlens_ptr + seq + 1) - q_start
    if q_block * BLOCK_M >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    i = q_block * BLOCK_M + tl.arange(0, BLOCK_M)
    imask = i < q_len
    q_pos = seq_len - q_len + i  # [M]
    rows = (q_start + i).to(tl.int64)
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + rows[:, None] * stride_qt + head * stride_qh + d[None, :],
                mask=imask[:, None], other=0.0)  # fmt: skip
    kv_head = head // GROUP
    table_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    m = tl.full((BLOCK_M,), -1e30, dtype=tl.float32)
    row_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    end = tl.minimum(seq_len, seq_len - q_len + (q_block + 1) * BLOCK_M)  # causal bound
    for t0 in range(0, end, BLOCK_N):
        toks = t0 + tl.arange(0, BLOCK_N)
        tmask = toks < end
        k, v = load_kv_tile(
            kv_ptr, table_row, toks, tmask, kv_head, stride_page, stride_kind, stride_tok, HEAD_DIM
        )
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2  # [M, N]
        visible = (toks[None, :] <= q_pos[:, None]) & tmask[None, :]
        scores = tl.where(visible, scores, float("-inf"))
        m, row_sum, acc = online_softmax_step(m, row_sum, acc, scores, v, DOT_PRECISION)
    o_ptrs = out_ptr + rows[:, None] * stride_ot + head * stride_oh + d[None, :]
    tl.store(o_ptrs, (acc / row_sum[:, None]).to(out_ptr.dtype.element_ty), mask=imask[:, None])


def paged_prefill_attention(
    q: torch.Tensor,
    kv_pages: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    max_query_len: int,
    *,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    block_m: int = 64,
    block_n: int = 64,
) -> torch.Tensor:
    check_kv_pages(kv_pages)
    check_query(q, kv_pages, out, "T")
    if seq_lens.dim() != 1:
        raise ValueError(f"seq_lens must be int32 [S]; got {tuple(seq_lens.shape)}")
    num_seqs = seq_lens.shape[0]
    check_int32_vector("seq_lens", seq_lens, num_seqs, q.device)
    check_int32_vector("cu_seqlens_q", cu_seqlens_q, num_seqs + 1, q.device)
    check_block_tables(block_tables, num_seqs, kv_pages)
    T, Hq, Dh = q.shape
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if T == 0 or seq_lens.shape[0] == 0:
        return out
    if max_query_len < 1:
        raise ValueError(
            f"max_query_len must be >= 1 when there are query tokens; got {max_query_len}"
        )
    grid = (seq_lens.shape[0], triton.cdiv(max_query_len, block_m), Hq)
    _prefill_kernel[grid](
        q, kv_pages, block_tables, cu_seqlens_q, seq_lens, out,
        default_scale(scale, Dh) * _LOG2E, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        block_tables.stride(0), kv_pages.stride(0), kv_pages.stride(1), kv_pages.stride(2),
        GROUP=Hq // kv_pages.shape[3], HEAD_DIM=Dh, BLOCK_M=block_m, BLOCK_N=block_n,
        DOT_PRECISION=dot_precision(q.dtype), num_warps=4, num_stages=2,
    )  # fmt: skip
    return out


def paged_prefill_attention_reference(
    q, kv_pages, block_tables, cu_seqlens_q, seq_lens, *, scale: float | None = None
) -> torch.Tensor:
    """fp32 math, result in q.dtype."""
    scale = default_scale(scale, q.shape[2])
    out = torch.empty_like(q)
    cu = cu_seqlens_q.tolist()
    for s, seq_len in enumerate(seq_lens.tolist()):
        rows = slice(cu[s], cu[s + 1])
        out[rows] = attend_sequence_reference(
            q[rows], kv_pages, block_tables[s], seq_len, scale
        ).to(q.dtype)
    return out
