"""The all-reduces of tensor parallelism, placed where partial sums join the residual stream.

A rank's o_proj and its MoE block (routed experts, shared expert, dense MLP) each yield a
partial sum over its slice (shard.py). Both are added to the residual stream through
`LayerOps.add_rms_norm` and nowhere else, so summing `x` across ranks there is exactly
vLLM's all-reduce after the row-parallel o_proj and after the MoE, with no change to the
decoder. Every rank then holds the same residual stream, bit for bit (a ring all-reduce
hands every rank the same sums), so every rank routes every token alike.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from rimuru.dataplane.model.ops import LayerOps


class AllReduceOps:
    """LayerOps that all-reduce the partial output before the residual add."""

    def __init__(self, inner: LayerOps, group: dist.ProcessGroup | None):
        self.inner = inner
        self.group = group

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return self.inner.rms_norm(x, weight, eps)

    def add_rms_norm(self, x, residual, weight, eps):
        # x is a fresh projection output, owned by this call: summed in place
        dist.all_reduce(x, group=self.group)
        return self.inner.add_rms_norm(x, residual, weight, eps)

    def qk_norm_rope(self, q, k, cos, sin, q_weight, k_weight, eps):
        return self.inner.qk_norm_rope(q, k, cos, sin, q_weight, k_weight, eps)

    def route(self, x, weight, bias, top_k, renormalize):
        return self.inner.route(x, weight, bias, top_k, renormalize)
