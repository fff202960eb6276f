"""Tokens routed to each expert, the torch way: the CPU path of the MoE backend's routing
statistics, and the reference of the one-launch kernel (rimuru.kernels.routing_histogram)
that the CUDA path calls in its place.

    routing_histogram_torch(topk_ids [T, K] int, num_experts, row_mask [T] int | None,
                            total [E] int64 | None) -> counts [E] int64

counts[e] = the pairs of rows with row_mask 1 (all rows when None; 0 marks a CUDA graph's
padding row) routed to expert e; when `total` is given, counts is also added to it in place.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

RoutingHistogram = Callable[..., torch.Tensor]


def routing_histogram_torch(
    topk_ids: torch.Tensor,
    num_experts: int,
    row_mask: torch.Tensor | None = None,
    total: torch.Tensor | None = None,
) -> torch.Tensor:
    """scatter_add of each pair's row weight. Not torch.bincount: on CUDA it reads the input's
    min and max back to the host, a synchronisation per call."""
    flat = topk_ids.flatten().to(torch.int64)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    if row_mask is None:
        counts.scatter_add_(0, flat, torch.ones_like(flat))
    else:  # 0/1 weights: the mask itself (no launch when it is int64 already)
        weight = row_mask.to(torch.int64)
        counts.scatter_add_(0, flat, weight[:, None].expand(topk_ids.shape).flatten())
    if total is not None:
        total += counts
    return counts
