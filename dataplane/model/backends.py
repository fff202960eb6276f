"""The places where the engine plugs into the model.

The model owns the math that is the same everywhere (norms, projections, RoPE, routing, the
shared expert). Where the engine's memory decides how the work is done, the model calls a
backend: attention reads and writes the KV cache, the routed experts live wherever the
engine keeps them (pool pages, loading buffers, host), and a hybrid model's Gated DeltaNet
states live in the pool's SSM and conv pages. `reference.py` holds simple dense
implementations of the first two, the oracle the paged engine is compared against.

Shape key: T = tokens of the step (several sequences concatenated, vLLM's flattened varlen
batch), Hq/Hkv = query/KV heads, Dh = head dim, D = hidden, K = experts per token.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch


class AttentionBackend(Protocol):
    def attend(
        self,
        layer: int,
        q: torch.Tensor,  # [T, Hq, Dh], after q-norm and RoPE
        k: torch.Tensor,  # [T, Hkv, Dh], after k-norm and RoPE
        v: torch.Tensor,  # [T, Hkv, Dh]
        meta: Any,
    ) -> torch.Tensor:  # [T, Hq, Dh]
        """Store this step's k/v for `layer`, then attend each token causally over its own
        sequence's history plus the new tokens before it. `meta` is the object the backend's
        owner built for this step (which tokens belong to which sequence, block tables, ...);
        the model passes it through untouched."""
        ...


class ExpertBackend(Protocol):
    def moe(
        self,
        layer: int,
        x: torch.Tensor,  # [T, D], the MoE block's input (after the post-attention norm)
        topk_ids: torch.Tensor,  # [T, K] int64 expert ids
        topk_weights: torch.Tensor,  # [T, K] fp32 mixing weights
    ) -> torch.Tensor:  # [T, D] in x's dtype
        """sum_k topk_weights[t, k] * expert_{topk_ids[t, k]}(x[t]) for the ROUTED experts of
        `layer` only; the shared expert is added by the model. `layer` counts MoE layers
        only (dense layers have no experts): it is decoder layer config.moe_layers[layer]."""
        ...


class StateBackend(Protocol):
    """Where a hybrid model's Gated DeltaNet layers keep each sequence's two states (the
    conv's last inputs and the recurrent SSM state) from one step to the next. Both calls
    continue every sequence of the step from its stored state and store the new one;
    `gdn_layer` counts GDN layers only (config.linear_attention_layers[gdn_layer])."""

    def conv(
        self,
        gdn_layer: int,
        x: torch.Tensor,  # [T, Cc], the qkv projection's output
        weight: torch.Tensor,  # [Cc, K]
        meta: Any,
    ) -> torch.Tensor:  # [T, Cc]: silu(causal depthwise conv)
        ...

    def delta_rule(
        self,
        gdn_layer: int,
        q: torch.Tensor,  # [T, Hk, Dk] fp32, L2-normalised
        k: torch.Tensor,  # [T, Hk, Dk] fp32, L2-normalised
        v: torch.Tensor,  # [T, Hv, Dv]
        g: torch.Tensor,  # [T, Hv] fp32 log decay
        beta: torch.Tensor,  # [T, Hv] fp32
        meta: Any,
    ) -> torch.Tensor:  # [T, Hv, Dv] in v's dtype
        ...
