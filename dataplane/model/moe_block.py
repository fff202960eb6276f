"""The block after a layer's token mixer, shared by every decoder: routing, the routed
experts (through the engine's expert backend) and the shared expert, or a dense MLP.

    x ── router (+ skew bias) ── softmax ── top-k ── expert backend ──(+)── out
      └── shared expert · sigmoid(gate) (Qwen2-MoE, the hybrids) ─────┘
    x ── gated MLP ── out                       (a dense layer: no router)

`w` is a `LayerWeights` or a `HybridLayerWeights`: both name these tensors alike.

Shape key: T = tokens, D = hidden, E = experts, K = top-k.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rimuru.dataplane.model.backends import ExpertBackend
from rimuru.dataplane.model.config import ModelConfig
from rimuru.dataplane.model.layers import router_topk, swiglu_mlp
from rimuru.dataplane.model.ops import LayerOps


def router_logits(w, x: torch.Tensor) -> torch.Tensor:
    """x [T, D] -> fp32 router logits [T, E], with the presets' skew bias if any."""
    logits = F.linear(x, w.router).float()
    if w.router_bias is not None:
        logits = logits + w.router_bias
    return logits


def select_experts(cfg: ModelConfig, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 router logits [T, E] -> (topk_ids [T, K] int64, topk_weights [T, K] fp32)."""
    return router_topk(logits, None, cfg.top_k, cfg.norm_topk_prob)


def mlp_block(
    cfg: ModelConfig,
    w,
    x: torch.Tensor,
    moe_layer: int | None,
    experts: ExpertBackend,
    ops: LayerOps,
) -> torch.Tensor:
    """x [T, D], post-attention-normed -> the MoE block's (or dense MLP's) output [T, D].
    `moe_layer` is the layer's index among MoE layers (None for a dense layer); `ops` routes
    (the router's GEMM, then its softmax and top-k: one kernel on CUDA)."""
    if w.dense_mlp is not None:
        m = w.dense_mlp
        return swiglu_mlp(x, m.gate_proj, m.up_proj, m.down_proj)
    topk_ids, topk_weights = ops.route(x, w.router, w.router_bias, cfg.top_k, cfg.norm_topk_prob)
    out = experts.moe(moe_layer, x, topk_ids, topk_weights)  # [T, D]
    shared = w.shared_expert
    if shared is not None:
        gate = torch.sigmoid(F.linear(x, shared.gate))  # [T, 1]
        out = out + gate * swiglu_mlp(x, shared.gate_proj, shared.up_proj, shared.down_proj)
    return out
