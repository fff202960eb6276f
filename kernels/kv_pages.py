"""The paged KV view shared by the attention kernels: checks and the tile gather.

Shape key: P = KV pages, Hkv = KV heads, Dh = head size, N = tokens per tile.

    kv_pages [P, 2, 16, Hkv, Dh]: kv_pages[p, 0] = K, kv_pages[p, 1] = V of 16 tokens
    token j of a sequence lives in page block_table[j // 16], row j % 16
"""

import torch
import triton
import triton.language as tl

PAGE_TOKENS = 16


def check_kv_pages(kv_pages: torch.Tensor) -> None:
    if kv_pages.dim() != 5 or kv_pages.shape[1] != 2 or kv_pages.shape[2] != PAGE_TOKENS:
        raise ValueError(f"kv_pages must be [P, 2, 16, Hkv, Dh]; got {tuple(kv_pages.shape)}")
    _, _, _, h_kv, dh = kv_pages.shape
    if kv_pages.stride(4) != 1 or kv_pages.stride(3) != dh or kv_pages.stride(2) != h_kv * dh:
        raise ValueError(
            f"each K or V page [16, Hkv, Dh] must be contiguous; got strides {kv_pages.stride()}"
        )


def check_block_tables(block_tables: torch.Tensor, num_seqs: int, kv_pages: torch.Tensor) -> None:
    if (
        block_tables.dim() != 2
        or block_tables.shape[0] != num_seqs
        or block_tables.dtype != torch.int32
        or (block_tables.shape[1] > 1 and block_tables.stride(1) != 1)
    ):  # a single column's stride is never used: torch leaves size-1 dims' strides arbitrary
        raise ValueError(
            f"block_tables must be int32 [{num_seqs}, max_blocks] with unit column stride; got "
            f"{tuple(block_tables.shape)} {block_tables.dtype} strides {block_tables.stride()}"
        )
    if block_tables.device != kv_pages.device:
        raise ValueError(f"block_tables is on {block_tables.device}; move it to {kv_pages.device}")


def check_head_dim(head_dim: int) -> None:
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(f"head size must be a power of two >= 16; got {head_dim}")


def check_query(
    q: torch.Tensor, kv_pages: torch.Tensor, out: torch.Tensor | None, rows: str
) -> None:
    """q and out are [rows, Hq, Dh] in kv_pages' dtype, Hq a multiple of Hkv."""
    h_kv, dh = kv_pages.shape[3], kv_pages.shape[4]
    check_head_dim(dh)
    if q.dim() != 3 or q.shape[2] != dh or q.shape[1] % h_kv or q.stride(2) != 1:
        raise ValueError(
            f"q must be [{rows}, Hq, Dh={dh}] with Hq a multiple of Hkv={h_kv} and unit last "
            f"stride; got {tuple(q.shape)} strides {q.stride()}"
        )
    if q.dtype != kv_pages.dtype or q.device != kv_pages.device:
        raise ValueError(
            f"q must be {kv_pages.dtype} on {kv_pages.device}; got {q.dtype} on {q.device}"
        )
    if out is not None and (out.shape != q.shape or out.dtype != q.dtype or out.stride(2) != 1):
        raise ValueError(f"out must be {q.dtype} {tuple(q.shape)} with unit last stride")


def check_int32_vector(name: str, t: torch.Tensor, length: int, device: torch.device) -> None:
    if t.shape != (length,) or t.dtype != torch.int32:
        raise ValueError(f"{name} must be int32 [{length}]; got {tuple(t.shape)} {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}; move it to {device}")


def default_scale(scale: float | None, head_dim: int) -> float:
    return head_dim**-0.5 if scale is None else scale


def attend_sequence_reference(
    q: torch.Tensor, kv_pages: torch.Tensor, block_table: torch.Tensor, seq_len: int, scale: float
) -> torch.Tensor:
    """Torch attention of one sequence's last q.shape[0] tokens [n, Hq, Dh] over its seq_len
    cached tokens, causal, fp32 math; returns [n, Hq, Dh] fp32."""
    n, hq = q.shape[0], q.shape[1]
    group = hq // kv_pages.shape[3]
    pages = block_table[: triton.cdiv(seq_len, PAGE_TOKENS)].long()
    kv = kv_pages[pages].float()  # [pages, 2, 16, Hkv, Dh]
    k = kv[:, 0].flatten(0, 1)[:seq_len].repeat_interleave(group, dim=1)  # [L, Hq, Dh]
    v = kv[:, 1].flatten(0, 1)[:seq_len].repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,lhd->hql", q.float(), k) * scale
    q_pos = torch.arange(seq_len - n, seq_len, device=q.device)
    hidden = torch.arange(seq_len, device=q.device)[None, :] > q_pos[:, None]  # [n, L]
    probs = scores.masked_fill(hidden, float("-inf")).softmax(-1)
    return torch.einsum("hql,lhd->qhd", probs, v)


@triton.jit
def load_kv_tile(
    kv_ptr,
    table_row_ptr,  # this sequence's block table
    toks,  # [N] token positions in the sequence
    tmask,  # [N] which of them exist
    kv_head,
    stride_page,
    stride_kind,
    stride_tok,
    HEAD_DIM: tl.constexpr,
):
    page = tl.load(table_row_ptr + toks // 16, mask=tmask, other=0).to(tl.int64)
    row = page * stride_page + (toks % 16) * stride_tok + kv_head * HEAD_DIM  # [N]
    ptrs = kv_ptr + row[:, None] + tl.arange(0, HEAD_DIM)[None, :]  # [N, Dh]
    k = tl.load(ptrs, mask=tmask[:, None], other=0.0)
    v = tl.load(ptrs + stride_kind, mask=tmask[:, None], other=0.0)
    return k, v


def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot's input precision: fp32 inputs exactly ("ieee"; Triton's default on NVIDIA is
    tf32, which would make fp32 attention disagree with the torch path); else the default."""
    return "ieee" if dtype == torch.float32 else "tf32"


@triton.jit
def online_softmax_step(m, row_sum, acc, scores, v, DOT_PRECISION: tl.constexpr):
    """Fold one tile of base-2 scores [M, N] and values [N, Dh] into (m, row_sum, acc).

    m starts finite (-1e30) so that a row whose scores are all -inf keeps p = 0, not NaN.
    """
    m_new = tl.maximum(m, tl.max(scores, axis=1))
    p = tl.exp2(scores - m_new[:, None])
    alpha = tl.exp2(m - m_new)
    row_sum = row_sum * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, row_sum, acc
