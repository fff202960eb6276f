"""Tokens routed to each expert in one launch, added to a running total in the same launch.

Shape key: T = tokens, K = top-k, P = T*K pairs, E = experts.

    routing_histogram(topk_ids [T, K] int, num_experts, row_mask [T] int | None,
                      total [E] int64 | None) -> counts [E] int64

counts[e] = the pairs of rows with row_mask 1 (every row when None; 0 marks a CUDA graph's
padding row) routed to expert e; when `total` is given, counts is also added to it in place.
The same as the torch chain it replaces (rimuru.dataplane.engine.experts.routing_histogram, the CPU
path: zeros, ones, scatter_add and the add into the total, four to five launches a layer on
the GPU).

One program walks the pairs CHUNK at a time and counts each chunk with tl.histogram, so no
two programs contend for an expert's count: a multi-program histogram by global atomics was
measured slower than the torch chain (hot experts serialise). A 1,024-token step's 8,192
pairs are 8 chunks; timed on the GPU at decode sizes only. Ids must lie in [0, E): the
kernel skips others rather than count out of bounds (the torch path raises). No host
synchronisation: safe inside a CUDA graph.
"""

import torch
import triton
import triton.language as tl

_CHUNK = 1024


# One compiled variant serves every batch and layer: a layer's total is a row view of [L, E],
# aligned or not by the layer.
@triton.jit(
    do_not_specialize=["num_pairs"], do_not_specialize_on_alignment=["mask_ptr", "total_ptr"]
)
def _routing_histogram_kernel(
    ids_ptr, mask_ptr, counts_ptr, total_ptr, num_pairs, num_experts,
    TOP_K: tl.constexpr, HAS_MASK: tl.constexpr, HAS_TOTAL: tl.constexpr,
    CHUNK: tl.constexpr, BINS: tl.constexpr,
):  # fmt: skip
    counts = tl.zeros((BINS,), dtype=tl.int32)
    for start in range(0, num_pairs, CHUNK):
        p = start + tl.arange(0, CHUNK)
        ok = p < num_pairs
        if HAS_MASK:
            ok &= tl.load(mask_ptr + p // TOP_K, mask=ok, other=0) != 0
        expert = tl.load(ids_ptr + p, mask=ok, other=0).to(tl.int32)
        ok &= (expert >= 0) & (expert < num_experts)
        counts += tl.histogram(expert, BINS, mask=ok)
    e = tl.arange(0, BINS)
    in_range = e < num_experts
    tl.store(counts_ptr + e, counts.to(tl.int64), mask=in_range)
    if HAS_TOTAL:
        old = tl.load(total_ptr + e, mask=in_range, other=0)
        tl.store(total_ptr + e, old + counts.to(tl.int64), mask=in_range)


def routing_histogram(
    topk_ids: torch.Tensor,
    num_experts: int,
    row_mask: torch.Tensor | None = None,
    total: torch.Tensor | None = None,
) -> torch.Tensor:
    ids = topk_ids.contiguous()
    num_rows, top_k = ids.shape
    if row_mask is not None and row_mask.shape != (num_rows,):
        raise ValueError(f"row_mask has shape {tuple(row_mask.shape)}, expected ({num_rows},)")
    if total is not None and (total.shape != (num_experts,) or total.dtype != torch.int64):
        raise ValueError(f"total must be [{num_experts}] int64, got {total.dtype} {total.shape}")
    if total is not None and not total.is_contiguous():
        raise ValueError("total must be contiguous (it is updated in place)")
    for name, t in (("row_mask", row_mask), ("total", total)):
        if t is not None and t.device != ids.device:
            raise ValueError(f"{name} is on {t.device}; topk_ids on {ids.device}")
    if row_mask is not None:
        row_mask = row_mask.contiguous()  # the kernel reads it by row index
    counts = torch.empty(num_experts, dtype=torch.int64, device=ids.device)
    _routing_histogram_kernel[(1,)](
        ids, row_mask if row_mask is not None else ids, counts,
        total if total is not None else counts, num_rows * top_k, num_experts,
        TOP_K=top_k, HAS_MASK=row_mask is not None, HAS_TOTAL=total is not None,
        CHUNK=_CHUNK, BINS=triton.next_power_of_2(num_experts),
    )  # fmt: skip
    return counts
