"""Which non-expert tensors a model has: their Hugging Face names and shapes, in one place.

Both weight sources build their typed weights here and differ only in `fetch(name, shape)`:
the loader reads the tensor from safetensors, a preset generates it. The names are the
checkpoint's (`model.layers.{l}.self_attn.q_proj.weight`, ...), so a preset's random tensor
for a name is seeded by that name.

Shape key: V = vocab, D = hidden, Dh = head dim, E = experts, S = shared expert size,
F = dense MLP size.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rimuru.dataplane.model.config import ModelConfig
from rimuru.dataplane.model.weights import (
    AttentionWeights,
    DenseMLPWeights,
    GlobalWeights,
    LayerWeights,
    SharedExpertWeights,
)

Fetch = Callable[[str, tuple[int, ...]], torch.Tensor]


def build_global_weights(cfg: ModelConfig, fetch: Fetch) -> GlobalWeights:
    vocab_by_hidden = (cfg.vocab_size, cfg.hidden_size)
    embed = fetch("model.embed_tokens.weight", vocab_by_hidden)  # [V, D]
    lm_head = embed if cfg.tie_word_embeddings else fetch("lm_head.weight", vocab_by_hidden)
    return GlobalWeights(
        embed_tokens=embed, norm=fetch("model.norm.weight", (cfg.hidden_size,)), lm_head=lm_head
    )


def build_layer_weights(
    cfg: ModelConfig, layer: int, fetch: Fetch, moe_block: str = "mlp"
) -> LayerWeights:
    """`moe_block` is the MoE module's name: "mlp", or Mixtral's classic "block_sparse_moe"."""
    cfg.check_layer(layer)
    p = f"model.layers.{layer}."
    hidden = cfg.hidden_size

    def get(name: str, *shape: int) -> torch.Tensor:
        return fetch(p + name, shape)

    def bias(proj: str, size: int, present: bool) -> torch.Tensor | None:
        return get(f"self_attn.{proj}.bias", size) if present else None

    attention = AttentionWeights(
        q_proj=get("self_attn.q_proj.weight", cfg.q_size, hidden),
        k_proj=get("self_attn.k_proj.weight", cfg.kv_size, hidden),
        v_proj=get("self_attn.v_proj.weight", cfg.kv_size, hidden),
        o_proj=get("self_attn.o_proj.weight", hidden, cfg.q_size),
        q_bias=bias("q_proj", cfg.q_size, cfg.qkv_bias),
        k_bias=bias("k_proj", cfg.kv_size, cfg.qkv_bias),
        v_bias=bias("v_proj", cfg.kv_size, cfg.qkv_bias),
        o_bias=bias("o_proj", hidden, cfg.o_bias),
        q_norm=get("self_attn.q_norm.weight", cfg.head_dim) if cfg.qk_norm else None,
        k_norm=get("self_attn.k_norm.weight", cfg.head_dim) if cfg.qk_norm else None,
    )
    input_norm = get("input_layernorm.weight", hidden)
    post_attention_norm = get("post_attention_layernorm.weight", hidden)
    if not cfg.is_moe_layer(layer):  # transformers' {Family}MLP under the name "mlp"
        dense = build_dense_mlp(cfg, p, fetch)
        return LayerWeights(input_norm, attention, post_attention_norm, None, dense_mlp=dense)
    shared = build_shared_expert(cfg, p, fetch) if cfg.has_shared_expert else None
    return LayerWeights(
        input_norm=input_norm,
        attention=attention,
        post_attention_norm=post_attention_norm,
        router=get(f"{moe_block}.gate.weight", cfg.num_experts, hidden),  # [E, D]
        shared_expert=shared,
    )


def build_dense_mlp(cfg: ModelConfig, layer_prefix: str, fetch: Fetch) -> DenseMLPWeights:
    size, hidden, p = cfg.dense_intermediate_size, cfg.hidden_size, layer_prefix + "mlp."
    return DenseMLPWeights(
        gate_proj=fetch(p + "gate_proj.weight", (size, hidden)),
        up_proj=fetch(p + "up_proj.weight", (size, hidden)),
        down_proj=fetch(p + "down_proj.weight", (hidden, size)),
    )


def build_shared_expert(cfg: ModelConfig, layer_prefix: str, fetch: Fetch) -> SharedExpertWeights:
    size, hidden, p = cfg.shared_expert_intermediate_size, cfg.hidden_size, layer_prefix + "mlp."
    return SharedExpertWeights(
        gate_proj=fetch(p + "shared_expert.gate_proj.weight", (size, hidden)),
        up_proj=fetch(p + "shared_expert.up_proj.weight", (size, hidden)),
        down_proj=fetch(p + "shared_expert.down_proj.weight", (hidden, size)),
        gate=fetch(p + "shared_expert_gate.weight", (1, hidden)),
    )


def is_norm_weight(name: str) -> bool:
    """RMSNorm scales (initialised to ones), as opposed to projection matrices and biases."""
    return name.endswith("norm.weight")


def is_router_weight(name: str) -> bool:
    return name.endswith(".gate.weight")
