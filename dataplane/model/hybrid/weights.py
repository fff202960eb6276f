"""The weights of a hybrid decoder layer (Qwen3-Next, Qwen3.5-MoE), in one layout for both.

The two families store Gated DeltaNet's input projections differently (checkpoint/hybrid_layout.py
reads both); here they are split by role, q/k/v rows in the order the conv sees them
(all q heads, all k heads, all v heads), value head j of key head h at h·G + j.

Shape key: D = hidden, Hq/Hkv = attention heads, Dh = head dim, Hk/Hv = GDN key/value
heads, Dk/Dv = their dims, Cc = conv channels (2·Hk·Dk + Hv·Dv), K = conv kernel,
E = routed experts. Matrices are [out, in] as in Hugging Face.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rimuru.dataplane.model.weights import DenseMLPWeights, SharedExpertWeights


@dataclass(frozen=True)
class GatedAttentionWeights:
    """Full attention whose output is scaled by sigmoid(gate); q/k norms scale by (1 + w)."""

    q_proj: torch.Tensor  # [Hq*Dh, D]
    gate_proj: torch.Tensor  # [Hq*Dh, D], the other half of the checkpoint's q_proj
    k_proj: torch.Tensor  # [Hkv*Dh, D]
    v_proj: torch.Tensor  # [Hkv*Dh, D]
    o_proj: torch.Tensor  # [D, Hq*Dh]
    q_norm: torch.Tensor  # [Dh], zero-centred
    k_norm: torch.Tensor  # [Dh], zero-centred


@dataclass(frozen=True)
class GatedDeltaNetWeights:
    qkv_proj: torch.Tensor  # [Cc, D]: q, k, v rows, the conv's channels
    z_proj: torch.Tensor  # [Hv*Dv, D], the output gate
    b_proj: torch.Tensor  # [Hv, D], beta = sigmoid(b)
    a_proj: torch.Tensor  # [Hv, D], g = -exp(A_log) * softplus(a + dt_bias)
    conv_weight: torch.Tensor  # [Cc, K]
    dt_bias: torch.Tensor  # [Hv]
    a_log: torch.Tensor  # [Hv]
    norm: torch.Tensor  # [Dv], the gated RMSNorm's scale (plain w, not 1 + w)
    out_proj: torch.Tensor  # [D, Hv*Dv]


@dataclass(frozen=True)
class HybridLayerWeights:
    """One decoder layer: a token mixer (attention or GDN), then MoE (router + shared expert)
    or a dense MLP. Norms are zero-centred (scale 1 + w)."""

    input_norm: torch.Tensor  # [D]
    mixer: GatedAttentionWeights | GatedDeltaNetWeights
    post_attention_norm: torch.Tensor  # [D]
    router: torch.Tensor | None  # [E, D]; None in a dense layer
    router_bias: torch.Tensor | None = None  # [E] fp32, the preset's router skew (None = none)
    shared_expert: SharedExpertWeights | None = None
    dense_mlp: DenseMLPWeights | None = None
    router_bias: torch.Tensor | None = None  # [E] fp32, the presets' router skew

    def __post_init__(self) -> None:
        if (self.router is None) == (self.dense_mlp is None):
            raise ValueError("a layer has either a router (MoE) or a dense_mlp, not both/neither")
