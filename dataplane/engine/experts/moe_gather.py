"""The ablation baseline for the paged kernel: gather, then compute contiguously.

Before every MoE layer, copy each routed expert's three matrices out of wherever they lie
(pool pages or loading-buffer slots) into contiguous stacks w13 [E', 2I, D] and w2 [E', D, I],
then run the contiguous kernel. This is what an engine without a page-table-aware kernel
must do; the paged kernel reads the pages in place instead. Same math, extra copies.

Shape key: T = tokens, K = top-k, E' = experts routed this step, I = intermediate, D = hidden.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def make_gather_moe(inter: int, hidden: int, contiguous_moe: Callable[..., torch.Tensor]):
    """A callable with the paged launcher's signature that gathers first.

    `contiguous_moe(x, topk_ids, topk_weights, w13, w2)` is the contiguous kernel (or its
    torch reference on the CPU)."""

    def gather_moe(x, topk_ids, topk_weights, pool_pages, buffer_pages, expert_table):
        used = torch.unique(topk_ids)  # [E']
        remap = torch.full((expert_table.shape[0],), -1, dtype=torch.int64, device=x.device)
        remap[used] = torch.arange(used.numel(), device=x.device)
        rows = expert_table.to(x.device)[used].to(torch.int64)  # [E', 3]

        def fetch(ids: torch.Tensor) -> torch.Tensor:  # ids [E'] -> [E', I*D]
            in_pool = (ids >= 0)[:, None]
            from_pool = pool_pages.index_select(0, ids.clamp(min=0))
            if buffer_pages is None:
                return from_pool
            from_buffer = buffer_pages.index_select(0, (-ids - 1).clamp(min=0))
            return torch.where(in_pool, from_pool, from_buffer)

        n = used.numel()
        w1 = fetch(rows[:, 0]).view(n, inter, hidden)
        w3 = fetch(rows[:, 1]).view(n, inter, hidden)
        w13 = torch.cat((w1, w3), dim=1)  # [E', 2I, D]
        w2 = fetch(rows[:, 2]).view(n, hidden, inter)  # [E', D, I]
        # The layer's E, not E': the kernels then do not change with how many experts a
        # step happens to route to (and the start-up warm-up covers them).
        num_experts = expert_table.shape[0]
        return contiguous_moe(x, remap[topk_ids], topk_weights, w13, w2, num_experts=num_experts)

    return gather_moe


def reference_contiguous(x, topk_ids, topk_weights, w13, w2, num_experts=None) -> torch.Tensor:
    """Torch contiguous MoE (the CPU stand-in for the contiguous kernel; num_experts, which
    only steers the kernel's config, is not needed here)."""
    from rimuru.kernels import fused_moe_reference

    inter = w13.shape[1] // 2
    return fused_moe_reference(x, topk_ids, topk_weights, w13[:, :inter], w13[:, inter:], w2)
