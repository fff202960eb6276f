"""The two places where the engine plugs into the model.

The model owns the math that is the same everywhere (norms, projections, RoPE, routing, the
shared expert). Where the engine's memory decides how the work is done, the model calls a
backend: attention reads and writes the KV cache, and the routed experts live wherever the
engine keeps them (pool pages, loading buffers, host). `reference.py` holds simple dense
implementations of both, the oracle the paged engine is compared against.

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
