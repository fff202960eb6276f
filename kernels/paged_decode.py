"""Paged decode attention (one new query token per sequence) over block tables, with GQA.

Shape key: B = sequences, Hq = query heads, Hkv = KV heads, G = Hq / Hkv, Dh = head size,
S = splits of the context, N = tokens per tile.

    paged_decode_attention(q [B, Hq, Dh], kv_pages [P, 2, 16, Hkv, Dh],
                           block_tables [B, max_blocks] int32, seq_lens [B] int32,
                           max_seq_len: int, *, scale=None, out=None,
                           tokens_per_split=None) -> [B, Hq, Dh]

seq_lens count every cached token including the current one (its K/V already written
with write_kv_pages); each must be >= 1 and <= max_seq_len. One program serves the G
query heads of one KV head over one split of the context, so each K/V tile is read once.
When there are too few (sequence, KV head) pairs to fill the GPU the context is split
(flash-decoding) and a second kernel merges the splits by their log-sum-exp.
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
_BLOCK_N = 64
_MIN_TOKENS_PER_SPLIT = 256


# Block-table width and split sizes vary with the batch: not specialised (one variant each).
# A layer's block table is a view into [L, S, W] and may start off a 16-byte boundary: its
# alignment is not specialised either (it only feeds per-block index loads); nor is seq_lens',
# a view into one upload of the step's vectors at an offset that moves with the batch.
@triton.jit(
    do_not_specialize=["stride_bt", "num_splits", "tokens_per_split"],
    do_not_specialize_on_alignment=["block_tables_ptr", "seq_lens_ptr"],
)
def _decode_kernel(
    q_ptr,
    kv_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    out_ptr,  # [B, Hq, Dh] when not SPLIT
    part_out_ptr,  # [B, Hq, S, Dh] fp32 when SPLIT
    part_lse_ptr,  # [B, Hq, S] fp32 when SPLIT
    scale_log2,
    stride_qb,
    stride_qh,
    stride_ob,
    stride_oh,
    stride_bt,
    stride_page,
    stride_kind,
    stride_tok,
    num_splits,
    tokens_per_split,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    start = split * tokens_per_split
    if start >= seq_len:
        return
    end = tl.minimum(seq_len, start + tokens_per_split)
    g = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + g  # [G]
    d = tl.arange(0, HEAD_DIM)
    q_ptrs = q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptrs, mask=(g < GROUP)[:, None], other=0.0)  # [G, Dh]
    table_row = block_tables_ptr + b.to(tl.int64) * stride_bt
    m = tl.full((GROUP_PAD,), -1e30, dtype=tl.float32)
    row_sum = tl.zeros((GROUP_PAD,), dtype=tl.float32)
    acc = tl.zeros((GROUP_PAD, HEAD_DIM), dtype=tl.float32)
    for t0 in range(start, end, BLOCK_N):
        toks = t0 + tl.arange(0, BLOCK_N)
        tmask = toks < end
        k, v = load_kv_tile(
            kv_ptr, table_row, toks, tmask, kv_head, stride_page, stride_kind, stride_tok, HEAD_DIM
        )
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2  # [G, N]
        scores = tl.where(tmask[None, :], scores, float("-inf"))
        m, row_sum, acc = online_softmax_step(m, row_sum, acc, scores, v, DOT_PRECISION)
    gmask = g < GROUP
    if SPLIT:
        row = (b * GROUP * tl.num_programs(1) + heads) * num_splits + split  # [G]
        tl.store(part_out_ptr + row[:, None] * HEAD_DIM + d[None, :], acc / row_sum[:, None],
                 mask=gmask[:, None])  # fmt: skip
        tl.store(part_lse_ptr + row, m + tl.log2(row_sum), mask=gmask)
    else:
        o_ptrs = out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :]
        tl.store(o_ptrs, (acc / row_sum[:, None]).to(out_ptr.dtype.element_ty), mask=gmask[:, None])


@triton.jit(do_not_specialize=["num_splits", "tokens_per_split"])
def _merge_splits_kernel(
    part_out_ptr,
    part_lse_ptr,
    seq_lens_ptr,
    out_ptr,
    stride_ob,
    stride_oh,
    num_splits,
    tokens_per_split,
    SPLITS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    used = tl.cdiv(tl.load(seq_lens_ptr + b), tokens_per_split)
    s = tl.arange(0, SPLITS_PAD)
    smask = s < used
    row = (b * tl.num_programs(1) + h) * num_splits + s  # [S]
    lse = tl.load(part_lse_ptr + row, mask=smask, other=float("-inf"))
    weight = tl.exp2(lse - tl.max(lse, axis=0))
    weight = weight / tl.sum(weight, axis=0)
    d = tl.arange(0, HEAD_DIM)
    parts = tl.load(
        part_out_ptr + row[:, None] * HEAD_DIM + d[None, :], mask=smask[:, None], other=0.0
    )
    merged = tl.sum(parts * weight[:, None], axis=0)  # [Dh]
    tl.store(out_ptr + b * stride_ob + h * stride_oh + d, merged.to(out_ptr.dtype.element_ty))


def _num_programs_wanted(device: torch.device) -> int:
    if device.type == "cuda":
        # 2 programs per SM beat 4 when timed (64 x 2k context, 4 KV heads).
        return 2 * torch.cuda.get_device_properties(device).multi_processor_count
    return 8


def _default_split(batch: int, h_kv: int, max_seq_len: int, device: torch.device) -> int:
    """Tokens per split when the caller gives none: enough splits to fill the device."""
    splits = triton.cdiv(_num_programs_wanted(device), batch * h_kv)
    tokens = max(_MIN_TOKENS_PER_SPLIT, triton.cdiv(max_seq_len, splits))
    return triton.cdiv(tokens, _BLOCK_N) * _BLOCK_N


def decode_warmup_contexts(h_kv: int, max_model_len: int, device: torch.device) -> list[int]:
    """Context lengths at which one sequence meets every compiled variant of the decode
    kernels under the default split sizing: unsplit, and each power-of-two padding of the
    merge kernel's split count (SPLITS_PAD) that a context up to max_model_len can reach.
    Larger batches only reach fewer splits, so these cover them too."""
    most = triton.cdiv(_num_programs_wanted(device), h_kv)  # splits of a batch of one
    contexts = [1]
    pad = 2
    while pad // 2 < most:
        splits = min(pad, most)  # a split count whose padding is `pad`
        context = splits * _MIN_TOKENS_PER_SPLIT
        if context > max_model_len:
            break
        assert triton.cdiv(context, _default_split(1, h_kv, context, device)) == splits
        contexts.append(context)
        pad *= 2
    return contexts


def paged_decode_attention(
    q: torch.Tensor,
    kv_pages: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    *,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    tokens_per_split: int | None = None,
) -> torch.Tensor:
    check_kv_pages(kv_pages)
    check_query(q, kv_pages, out, "B")
    check_block_tables(block_tables, q.shape[0], kv_pages)
    check_int32_vector("seq_lens", seq_lens, q.shape[0], q.device)
    B, Hq, Dh = q.shape
    h_kv = kv_pages.shape[3]
    if max_seq_len < 1:
        raise ValueError(
            f"max_seq_len must be >= 1 (the current token is cached); got {max_seq_len}"
        )
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if B == 0:
        return out
    if tokens_per_split is None:
        tokens_per_split = _default_split(B, h_kv, max_seq_len, q.device)
    tokens_per_split = triton.cdiv(tokens_per_split, _BLOCK_N) * _BLOCK_N
    num_splits = triton.cdiv(max_seq_len, tokens_per_split)
    group = Hq // h_kv
    split = num_splits > 1
    part_out = part_lse = out  # unused unless split
    if split:
        part_out = torch.empty(B, Hq, num_splits, Dh, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(B, Hq, num_splits, dtype=torch.float32, device=q.device)
    _decode_kernel[(B, h_kv, num_splits)](
        q, kv_pages, block_tables, seq_lens, out, part_out, part_lse,
        default_scale(scale, Dh) * _LOG2E, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        block_tables.stride(0), kv_pages.stride(0), kv_pages.stride(1), kv_pages.stride(2),
        num_splits, tokens_per_split,
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=Dh,
        BLOCK_N=_BLOCK_N, SPLIT=split, DOT_PRECISION=dot_precision(q.dtype), num_warps=4, num_stages=3,
    )  # fmt: skip
    if split:
        _merge_splits_kernel[(B, Hq)](
            part_out, part_lse, seq_lens, out, out.stride(0), out.stride(1),
            num_splits, tokens_per_split,
            SPLITS_PAD=triton.next_power_of_2(num_splits), HEAD_DIM=Dh,
        )  # fmt: skip
    return out


def paged_decode_attention_reference(
    q, kv_pages, block_tables, seq_lens, *, scale: float | None = None
) -> torch.Tensor:
    """fp32 math, result in q.dtype."""
    scale = default_scale(scale, q.shape[2])
    out = torch.empty_like(q)
    for b, seq_len in enumerate(seq_lens.tolist()):
        row = attend_sequence_reference(q[b : b + 1], kv_pages, block_tables[b], seq_len, scale)
        out[b] = row[0].to(q.dtype)
    return out
