"""A hybrid layer's tensors by their Hugging Face names, into `HybridLayerWeights`.

Gated DeltaNet's input projections come in two layouts:

    qwen3_next   in_proj_qkvz [Hk*(2Dk + 2G*Dv), D], rows grouped by key head h:
                     [ q_h (Dk) | k_h (Dk) | v of h's G value heads (G*Dv) | z of them (G*Dv) ]
                 in_proj_ba   [Hk*2G, D], grouped by key head: [ b (G) | a (G) ]
    qwen3_5_moe  in_proj_qkv [Cc, D] (all q, all k, all v), in_proj_z, in_proj_b, in_proj_a

Both become the split layout of hybrid/weights.py: regrouping rows is exact, so the same
math runs on either. Gated attention's q_proj [Hq*2Dh, D] holds, per head, its Dh query rows
then its Dh gate rows; they are split the same way.

Shape key as in hybrid/weights.py; G = Hv / Hk.
"""

from __future__ import annotations

import torch

from rimuru.dataplane.model.checkpoint.hf_layout import Fetch, build_dense_mlp, build_shared_expert
from rimuru.dataplane.model.config import ModelConfig
from rimuru.dataplane.model.hybrid.weights import (
    GatedAttentionWeights,
    GatedDeltaNetWeights,
    HybridLayerWeights,
)


def build_hybrid_layer_weights(cfg: ModelConfig, layer: int, fetch: Fetch) -> HybridLayerWeights:
    if not cfg.is_hybrid:
        raise ValueError(f"{cfg.family} is not a hybrid family")
    p = f"model.layers.{layer}."
    hidden = cfg.hidden_size

    def get(name: str, *shape: int) -> torch.Tensor:
        return fetch(p + name, shape)

    if cfg.is_linear_attention_layer(layer):
        mixer = _gated_delta_net(cfg, lambda name, *shape: get("linear_attn." + name, *shape))
    else:
        mixer = _gated_attention(cfg, lambda name, *shape: get("self_attn." + name, *shape))
    norms = dict(
        input_norm=get("input_layernorm.weight", hidden),
        post_attention_norm=get("post_attention_layernorm.weight", hidden),
    )
    if not cfg.is_moe_layer(layer):
        dense = build_dense_mlp(cfg, p, fetch)
        return HybridLayerWeights(mixer=mixer, router=None, dense_mlp=dense, **norms)
    shared = build_shared_expert(cfg, p, fetch)
    router = get("mlp.gate.weight", cfg.num_experts, hidden)  # [E, D]
    return HybridLayerWeights(mixer=mixer, router=router, shared_expert=shared, **norms)


def _gated_attention(cfg: ModelConfig, get) -> GatedAttentionWeights:
    hidden, heads, head_dim = cfg.hidden_size, cfg.num_heads, cfg.head_dim
    q_and_gate = get("q_proj.weight", 2 * cfg.q_size, hidden).view(heads, 2, head_dim, hidden)
    return GatedAttentionWeights(
        q_proj=q_and_gate[:, 0].reshape(cfg.q_size, hidden),
        gate_proj=q_and_gate[:, 1].reshape(cfg.q_size, hidden),
        k_proj=get("k_proj.weight", cfg.kv_size, hidden),
        v_proj=get("v_proj.weight", cfg.kv_size, hidden),
        o_proj=get("o_proj.weight", hidden, cfg.q_size),
        q_norm=get("q_norm.weight", head_dim),
        k_norm=get("k_norm.weight", head_dim),
    )


def _gated_delta_net(cfg: ModelConfig, get) -> GatedDeltaNetWeights:
    gdn, hidden = cfg.linear_attention, cfg.hidden_size
    hk, hv, dk, dv = gdn.num_key_heads, gdn.num_value_heads, gdn.key_head_dim, gdn.value_head_dim
    group = hv // hk
    if cfg.family == "qwen3_next":
        per_head = 2 * dk + 2 * group * dv
        qkvz = get("in_proj_qkvz.weight", hk * per_head, hidden).view(hk, per_head, hidden)
        q, k, v, z = qkvz.split([dk, dk, group * dv, group * dv], dim=1)
        qkv = torch.cat([x.reshape(-1, hidden) for x in (q, k, v)])  # [Cc, D]
        z = z.reshape(hv * dv, hidden)
        b, a = get("in_proj_ba.weight", 2 * hv, hidden).view(hk, 2, group, hidden).unbind(1)
        b, a = b.reshape(hv, hidden), a.reshape(hv, hidden)
    else:
        qkv = get("in_proj_qkv.weight", gdn.conv_dim, hidden)
        z = get("in_proj_z.weight", gdn.value_size, hidden)
        b = get("in_proj_b.weight", hv, hidden)
        a = get("in_proj_a.weight", hv, hidden)
    return GatedDeltaNetWeights(
        qkv_proj=qkv.contiguous(),
        z_proj=z.contiguous(),
        b_proj=b.contiguous(),
        a_proj=a.contiguous(),
        conv_weight=get("conv1d.weight", gdn.conv_dim, 1, gdn.conv_kernel_size)[:, 0],
        dt_bias=get("dt_bias", hv),
        a_log=get("A_log", hv),
        norm=get("norm.weight", dv),
        out_proj=get("out_proj.weight", hidden, gdn.value_size),
    )
