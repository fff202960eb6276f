"""The elementwise steps of a layer and its routing, two ways: torch (the CPU path, Hugging
Face's numerics) and Triton kernels (`rimuru.kernels.rms_norm`, `.rope`, `.router_topk`; the
engine's path on CUDA).

Both round alike (see the kernels' docstrings), so the choice changes launch counts, not
tokens beyond a reduction's last bits. The fused kernels exist to cut a decode layer's
launches (small decode steps are bound by launch count, not arithmetic; the counts per step
are in docs/benchmarks.md); routing takes the router's softmax, top-k and renormalisation
from six or seven launches to one, after its GEMM.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from rimuru.dataplane.model.layers import apply_rope, rms_norm, router_topk


class LayerOps(Protocol):
    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor: ...

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(rms_norm(x + residual), x + residual): the residual stream's add, then its norm."""
        ...

    def qk_norm_rope(
        self,
        q: torch.Tensor,  # [T, Hq, Dh]
        k: torch.Tensor,  # [T, Hkv, Dh]
        cos: torch.Tensor,  # [T, Dh]
        sin: torch.Tensor,
        q_weight: torch.Tensor | None,  # [Dh] per-head norms (Qwen3), or None for none
        k_weight: torch.Tensor | None,
        eps: float,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def route(
        self,
        x: torch.Tensor,  # [T, D], the post-attention-normed hidden states
        weight: torch.Tensor,  # [E, D], the router
        bias: torch.Tensor | None,  # [E] fp32 (the presets' skew), added before the softmax
        top_k: int,
        renormalize: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (topk_ids [T, K] int64, topk_weights [T, K] fp32): layers.router_topk of the
        router's logits x @ weight.T (in the model's dtype)."""
        ...


class TorchOps:
    def rms_norm(self, x, weight, eps):
        return rms_norm(x, weight, eps)

    def add_rms_norm(self, x, residual, weight, eps):
        residual = residual + x
        return rms_norm(residual, weight, eps), residual

    def qk_norm_rope(self, q, k, cos, sin, q_weight, k_weight, eps):
        if (q_weight is None) != (k_weight is None):
            raise ValueError("q/k norms: give both weights or neither")
        if q_weight is not None:
            q, k = rms_norm(q, q_weight, eps), rms_norm(k, k_weight, eps)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin)

    def route(self, x, weight, bias, top_k, renormalize):
        return router_topk(F.linear(x, weight), bias, top_k, renormalize)


class TritonOps:
    def __init__(self) -> None:
        from rimuru.kernels.rms_norm import rms_norm as rms_norm_kernel  # needs Triton
        from rimuru.kernels.rope import qk_norm_rope
        from rimuru.kernels.router_topk import router_topk as router_topk_kernel

        self._rms_norm = rms_norm_kernel
        self._qk_norm_rope = qk_norm_rope
        self._router_topk = router_topk_kernel

    def rms_norm(self, x, weight, eps):
        return self._rms_norm(x, weight, eps)

    def add_rms_norm(self, x, residual, weight, eps):
        return self._rms_norm(x, weight, eps, residual=residual)

    def qk_norm_rope(self, q, k, cos, sin, q_weight, k_weight, eps):
        return self._qk_norm_rope(q, k, cos, sin, q_weight, k_weight, eps)

    def route(self, x, weight, bias, top_k, renormalize):
        # the library GEMM, then one kernel for the rest
        return self._router_topk(F.linear(x, weight), bias, top_k, renormalize)
