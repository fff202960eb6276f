"""The hybrid decoder (Qwen3-Next, Qwen3.5-MoE) the engine serves: `HybridTransformer`.

The same layers as the whole-sequence oracle (reference.py, built from the same
pieces in layers.py), over a flattened batch of several sequences (vLLM style), with
what persists between steps behind backends:

    linear_attention layer  conv and gated delta rule ── StateBackend (the pool's conv and
                            SSM pages of each sequence)
    full_attention layer    attention ── AttentionBackend (the pool's KV pages), called with
                            the layer's index among attention layers (its KV layer)
    every MoE layer         routed experts ── ExpertBackend, by MoE-layer index

Zero-centred norms (scale 1 + w in the checkpoint) are turned into plain scales once, at
load: the residual adds and norms then go through the same `ops` as MoETransformer's (fused
Triton kernels on CUDA). The GDN's gated norm is a plain scale already.

`meta` (built by the engine per step) carries `.attention` for the attention backend and
`.states` for the state backend; the model passes both through untouched.

Shape key: T = tokens of the step, D = hidden, V = vocab.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from rimuru.dataplane.model.backends import AttentionBackend, ExpertBackend, StateBackend
from rimuru.dataplane.model.config import ModelConfig
from rimuru.dataplane.model.hybrid.layers import (
    gated_attention_inputs,
    gated_attention_output,
    gdn_gates,
    gdn_output,
    gdn_split,
)
from rimuru.dataplane.model.hybrid.weights import (
    GatedAttentionWeights,
    GatedDeltaNetWeights,
    HybridLayerWeights,
)
from rimuru.dataplane.model.layers import rms_norm, rope_cos_sin, rope_inv_freq
from rimuru.dataplane.model.moe_block import mlp_block, router_logits, select_experts
from rimuru.dataplane.model.ops import LayerOps, TorchOps
from rimuru.dataplane.model.weights import GlobalWeights, WeightSource


class HybridTransformer:
    """Resident (non-expert) weights, norms as plain scales, and the three backends."""

    def __init__(
        self,
        config: ModelConfig,
        global_weights: GlobalWeights,
        layers: Sequence[HybridLayerWeights],
        attention: AttentionBackend,
        experts: ExpertBackend,
        states: StateBackend | None = None,
        ops: LayerOps | None = None,
    ) -> None:
        """`global_weights` and `layers` hold plain norm scales (`from_source` converts)."""
        if not config.is_hybrid or len(layers) != config.num_layers:
            raise ValueError(f"need a hybrid config and its {config.num_layers} layers' weights")
        self.config = config
        self.weights = global_weights
        self.layers = list(layers)
        self.attention = attention
        self.experts = experts
        self.states = states
        self.ops: LayerOps = ops or TorchOps()
        self.device = global_weights.embed_tokens.device
        self.dtype = global_weights.embed_tokens.dtype
        self._inv_freq = rope_inv_freq(config.rotary_dim, config.rope_theta, self.device)
        self._moe_layers = config.moe_layers
        self._moe_index = {layer: m for m, layer in enumerate(self._moe_layers)}
        # decoder layer -> its index among attention (KV) layers or among GDN layers
        self._kv_index = {layer: i for i, layer in enumerate(config.full_attention_layers)}
        self._gdn_index = {layer: i for i, layer in enumerate(config.linear_attention_layers)}

    @classmethod
    def from_source(
        cls,
        source: WeightSource,
        attention: AttentionBackend,
        experts: ExpertBackend,
        device: torch.device | str = "cpu",
        dtype: torch.dtype | None = None,
        ops: LayerOps | None = None,
    ) -> HybridTransformer:
        """The non-expert weights on `device`, zero-centred norms turned into 1 + w."""
        device = torch.device(device)
        dtype = dtype or source.config.dtype
        layers = [
            _plain_norms(source.layer_weights(i, device, dtype))
            for i in range(source.config.num_layers)
        ]
        g = source.global_weights(device, dtype)
        g = dataclasses.replace(g, norm=_plain(g.norm))
        return cls(source.config, g, layers, attention, experts, None, ops)

    def with_backends(
        self,
        attention: AttentionBackend,
        experts: ExpertBackend,
        states: StateBackend | None = None,
    ) -> HybridTransformer:
        """The same resident weights (shared, not copied) behind other backends."""
        return HybridTransformer(
            self.config, self.weights, self.layers, attention, experts, states, self.ops
        )

    def resident_nbytes(self) -> int:
        """Bytes of the non-expert weights held on the device (tied lm_head counted once)."""
        tensors = [*vars(self.weights).values()]
        for w in self.layers:
            tensors += [w.input_norm, w.post_attention_norm, w.router, w.router_bias]
            tensors += vars(w.mixer).values()
            for block in (w.shared_expert, w.dense_mlp):
                if block is not None:
                    tensors += vars(block).values()
        seen = {t.data_ptr(): t.numel() * t.element_size() for t in tensors if t is not None}
        return sum(seen.values())

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: Any) -> torch.Tensor:
        """input_ids [T], positions [T] -> final-normed hidden states [T, D]."""
        if input_ids.dim() != 1 or positions.shape != input_ids.shape:
            raise ValueError(
                f"input_ids and positions must both be 1-D [T] (flattened batch), got "
                f"{tuple(input_ids.shape)} and {tuple(positions.shape)}"
            )
        cfg, eps = self.config, self.config.rms_norm_eps
        rope = rope_cos_sin(positions.to(self.device), self._inv_freq, self.dtype)
        residual = F.embedding(input_ids.to(self.device), self.weights.embed_tokens)  # [T, D]
        x = self.ops.rms_norm(residual, self.layers[0].input_norm, eps)
        for layer, w in enumerate(self.layers):
            if isinstance(w.mixer, GatedDeltaNetWeights):
                out = self._gated_delta_net(self._gdn_index[layer], w.mixer, x, meta.states)
            else:
                out = self._attention(self._kv_index[layer], w.mixer, x, rope, meta.attention)
            x, residual = self.ops.add_rms_norm(out, residual, w.post_attention_norm, eps)
            out = mlp_block(cfg, w, x, self._moe_index.get(layer), self.experts, self.ops)
            last = layer + 1 == cfg.num_layers
            norm = self.weights.norm if last else self.layers[layer + 1].input_norm
            x, residual = self.ops.add_rms_norm(out, residual, norm, eps)
        return x

    def _gated_delta_net(
        self, gdn_layer: int, w: GatedDeltaNetWeights, x: torch.Tensor, meta: Any
    ) -> torch.Tensor:
        mixed = self.states.conv(gdn_layer, F.linear(x, w.qkv_proj), w.conv_weight, meta)
        q, k, v = gdn_split(self.config, mixed)
        beta, g = gdn_gates(w, x)
        out = self.states.delta_rule(gdn_layer, q, k, v, g, beta, meta)  # [T, Hv, Dv]
        return gdn_output(self.config, w, x, out)

    def _attention(
        self, kv_layer: int, w: GatedAttentionWeights, x: torch.Tensor, rope, meta: Any
    ) -> torch.Tensor:
        eps = self.config.rms_norm_eps
        q, k, v, gate = gated_attention_inputs(
            self.config, w, x, rope, lambda t, weight: rms_norm(t, weight, eps)
        )
        return gated_attention_output(w, self.attention.attend(kv_layer, q, k, v, meta), gate)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, D] -> fp32 logits [N, V]."""
        return F.linear(hidden, self.weights.lm_head).float()

    @torch.inference_mode()
    def router_logits(self, moe_layer: int, x: torch.Tensor) -> torch.Tensor:
        """MoE layer `moe_layer`'s router (+ skew bias) on x [T, D] -> fp32 [T, E]."""
        return router_logits(self.layers[self._moe_layers[moe_layer]], x)

    def select_experts(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return select_experts(self.config, logits)


def _plain(weight: torch.Tensor) -> torch.Tensor:
    """A zero-centred norm weight w -> the scale 1 + w (computed in fp32, as transformers)."""
    return (1.0 + weight.float()).to(weight.dtype)


def _plain_norms(w: HybridLayerWeights) -> HybridLayerWeights:
    mixer = w.mixer
    if isinstance(mixer, GatedAttentionWeights):
        mixer = dataclasses.replace(mixer, q_norm=_plain(mixer.q_norm), k_norm=_plain(mixer.k_norm))
    return dataclasses.replace(
        w,
        input_norm=_plain(w.input_norm),
        post_attention_norm=_plain(w.post_attention_norm),
        mixer=mixer,
    )
