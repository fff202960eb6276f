"""Routing counts in one launch: add each (token, expert) pair's count into [E] counters.

Shape key: T = tokens, K = top-k, E = experts.

    count_routes(topk_ids [T, K] int, rows [T] int64 | None, counts [E] int64,
                 also [E] int64 | None = None) -> counts
        counts[topk_ids[t, k]] += rows[t] (1 where rows is None), in place; and the same
        into `also` (a layer's step counts and its running statistics at once)

The torch chain it replaces (count_routes_reference: zeros, the row weights expanded per
pair, scatter_add, then the add into the statistics) is four to five launches a MoE layer.
Integer atomics: the sums do not depend on the order the pairs land in.
"""

import torch
import triton
import triton.language as tl

_BLOCK = 1024  # pairs a program


@triton.jit(do_not_specialize=["num_pairs"])  # one compiled variant serves every batch
def _count_routes_kernel(
    ids_ptr, rows_ptr, counts_ptr, also_ptr, num_pairs,
    TOP_K: tl.constexpr, HAS_ROWS: tl.constexpr, HAS_ALSO: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = p < num_pairs
    expert = tl.load(ids_ptr + p, mask=valid, other=0)
    if HAS_ROWS:
        weight = tl.load(rows_ptr + p // TOP_K, mask=valid, other=0).to(tl.int64)
    else:
        weight = tl.full((BLOCK,), 1, dtype=tl.int64)
    tl.atomic_add(counts_ptr + expert, weight, mask=valid)
    if HAS_ALSO:
        tl.atomic_add(also_ptr + expert, weight, mask=valid)


def count_routes(
    topk_ids: torch.Tensor,
    rows: torch.Tensor | None,
    counts: torch.Tensor,
    also: torch.Tensor | None = None,
) -> torch.Tensor:
    """counts [E] int64 (and `also`) += pairs routed to each expert, token t weighted by
    rows[t]."""
    if topk_ids.dim() != 2 or topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"topk_ids must be int32/int64 [T, K]; got {tuple(topk_ids.shape)} {topk_ids.dtype}"
        )
    for name, t in (("counts", counts), ("also", also if also is not None else counts)):
        if t.shape != counts.shape or t.dim() != 1 or t.dtype != torch.int64:
            raise ValueError(f"{name} must be an int64 [E] tensor; got {tuple(t.shape)} {t.dtype}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    if rows is not None and (rows.dim() != 1 or rows.shape[0] != topk_ids.shape[0]):
        raise ValueError(f"rows must be [T={topk_ids.shape[0]}]; got {tuple(rows.shape)}")
    ids = topk_ids.contiguous()
    num_pairs = ids.numel()
    if num_pairs:
        _count_routes_kernel[(triton.cdiv(num_pairs, _BLOCK),)](
            ids, ids if rows is None else rows.contiguous(), counts,
            counts if also is None else also, num_pairs,
            TOP_K=ids.shape[1], HAS_ROWS=rows is not None, HAS_ALSO=also is not None,
            BLOCK=_BLOCK, num_warps=4,
        )  # fmt: skip
    return counts


def count_routes_reference(
    topk_ids: torch.Tensor,
    rows: torch.Tensor | None,
    counts: torch.Tensor,
    also: torch.Tensor | None = None,
) -> torch.Tensor:
    flat = topk_ids.flatten().to(torch.int64)
    weight = torch.ones_like(flat) if rows is None else rows[:, None].expand(topk_ids.shape)
    step = torch.zeros_like(counts).scatter_add_(0, flat, weight.flatten().to(torch.int64))
    if also is not None:
        also += step
    return counts.add_(step)
