"""The MoE decoder: Qwen2-MoE, Qwen3-MoE and Mixtral with family switches from `ModelConfig`.

One forward handles a flattened batch (vLLM style): the tokens of several sequences,
concatenated, each with its own position. Attention and the routed experts go through the
backends (see `backends.py`); projections are torch on resident weights, and norms and RoPE
go through `ops` (torch, or fused Triton kernels on CUDA; see `ops.py`).

Per layer:

    h ── rms_norm ── q,k,v proj ── (q/k norm) ── RoPE ── attention backend ── o proj ──(+)── h
    h ── rms_norm ── router (+ skew bias) ── top-k ── expert backend ──────────────────(+)── h
                 └── shared expert · sigmoid(gate) (Qwen2-MoE only) ──────────────────(+)──┘

A dense layer (config.dense_layers) has a resident gated MLP where an MoE layer has the router
and experts. The expert backend and `router_logits` take MoE-layer indices: MoE layer m is
decoder layer config.moe_layers[m].

Each (+) into h is fused with the rms_norm after it (`ops.add_rms_norm`, vLLM's
fused_add_rms_norm); the last one with the final norm.

Shape key: T = tokens, D = hidden, Hq/Hkv = heads, Dh = head dim, E = experts, K = top-k,
V = vocab.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F

from rimuru.dataplane.model.backends import AttentionBackend, ExpertBackend
from rimuru.dataplane.model.config import ModelConfig
from rimuru.dataplane.model.layers import rope_cos_sin, rope_inv_freq
from rimuru.dataplane.model.moe_block import mlp_block, router_logits, select_experts
from rimuru.dataplane.model.ops import LayerOps, TorchOps
from rimuru.dataplane.model.weights import GlobalWeights, LayerWeights, WeightSource


class MoETransformer:
    """Resident (non-expert) weights plus the two backends that do the rest."""

    def __init__(
        self,
        config: ModelConfig,
        global_weights: GlobalWeights,
        layers: list[LayerWeights],
        attention: AttentionBackend,
        experts: ExpertBackend,
        ops: LayerOps | None = None,
    ) -> None:
        if len(layers) != config.num_layers:
            raise ValueError(
                f"got {len(layers)} layers of weights, config says {config.num_layers}"
            )
        self.config = config
        self.weights = global_weights
        self.layers = layers
        self.attention = attention
        self.experts = experts
        self.ops: LayerOps = ops or TorchOps()
        self.device = global_weights.embed_tokens.device
        self.dtype = global_weights.embed_tokens.dtype
        self._inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, self.device)
        self._moe_layers = config.moe_layers  # MoE layer -> decoder layer
        self._moe_index = {layer: m for m, layer in enumerate(self._moe_layers)}

    @classmethod
    def from_source(
        cls,
        source: WeightSource,
        attention: AttentionBackend,
        experts: ExpertBackend,
        device: torch.device | str = "cpu",
        dtype: torch.dtype | None = None,
        ops: LayerOps | None = None,
    ) -> MoETransformer:
        """Load the non-expert weights onto `device`; routed experts are the backend's business."""
        device = torch.device(device)
        dtype = dtype or source.config.dtype
        layers = [
            _fuse_qkv(source.layer_weights(i, device, dtype))
            for i in range(source.config.num_layers)
        ]
        weights = source.global_weights(device, dtype)
        return cls(source.config, weights, layers, attention, experts, ops)

    def with_backends(self, attention: AttentionBackend, experts: ExpertBackend) -> MoETransformer:
        """The same resident weights (shared, not copied) and ops behind other backends."""
        return MoETransformer(self.config, self.weights, self.layers, attention, experts, self.ops)

    def resident_nbytes(self) -> int:
        """Bytes of the non-expert weights held on the device (tied lm_head counted once)."""
        seen: dict[int, int] = {}
        tensors = [*vars(self.weights).values()]
        for layer in self.layers:
            a = layer.attention
            fused = ("q_proj", "k_proj", "v_proj", "q_bias", "k_bias", "v_bias")
            # once fused, q/k/v and their biases are views of qkv_proj / qkv_bias
            skip = fused if a.qkv_proj is not None else ()
            tensors += [t for name, t in vars(a).items() if name not in skip]
            tensors += [layer.input_norm, layer.post_attention_norm]
            tensors += [layer.router, layer.router_bias]
            if layer.shared_expert is not None:
                tensors += vars(layer.shared_expert).values()
            if layer.dense_mlp is not None:
                tensors += vars(layer.dense_mlp).values()
        for t in tensors:
            if t is not None:
                seen[t.data_ptr()] = t.numel() * t.element_size()
        return sum(seen.values())

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn_meta: Any
    ) -> torch.Tensor:
        """input_ids [T], positions [T] -> final-normed hidden states [T, D].

        The pieces between two attentions (`embed`, `pre_attention`, `post_attention`) are
        also what piecewise CUDA graphs capture (engine/graphs/piecewise_graphs.py)."""
        if input_ids.dim() != 1 or positions.shape != input_ids.shape:
            raise ValueError(
                f"input_ids and positions must both be 1-D [T] (flattened batch), got "
                f"{tuple(input_ids.shape)} and {tuple(positions.shape)}"
            )
        x, residual, rope = self.embed(input_ids, positions)
        for layer in range(self.config.num_layers):
            q, k, v = self.pre_attention(layer, x, rope)
            out = self.attention.attend(layer, q, k, v, attn_meta)  # [T, Hq, Dh]
            x, residual = self.post_attention(layer, out, residual)
        return x

    def embed(
        self, input_ids: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """-> (layer 0's normed input x [T, D], the residual stream [T, D], RoPE (cos, sin))."""
        rope = rope_cos_sin(positions.to(self.device), self._inv_freq, self.dtype)
        # The residual stream: each block's output is added to it, and the add is fused with
        # the norm that follows it (the next block's input norm, or the final norm).
        residual = F.embedding(input_ids.to(self.device), self.weights.embed_tokens)  # [T, D]
        x = self.ops.rms_norm(residual, self.layers[0].input_norm, self.config.rms_norm_eps)
        return x, residual, rope

    def pre_attention(
        self, layer: int, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [T, D], input-normed -> q [T, Hq, Dh], k and v [T, Hkv, Dh], q/k normed and rotated."""
        cfg, a = self.config, self.layers[layer].attention
        num_tokens = x.shape[0]
        if a.qkv_proj is not None:  # one GEMM, split (vLLM's QKVParallelLinear)
            q, k, v = F.linear(x, a.qkv_proj, a.qkv_bias).split(
                [cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1
            )
        else:
            q = F.linear(x, a.q_proj, a.q_bias)
            k = F.linear(x, a.k_proj, a.k_bias)
            v = F.linear(x, a.v_proj, a.v_bias)
        q = q.reshape(num_tokens, cfg.num_heads, cfg.head_dim)
        k = k.reshape(num_tokens, cfg.num_kv_heads, cfg.head_dim)
        v = v.reshape(num_tokens, cfg.num_kv_heads, cfg.head_dim)
        q, k = self.ops.qk_norm_rope(q, k, *rope, a.q_norm, a.k_norm, cfg.rms_norm_eps)
        return q, k, v

    def post_attention(
        self, layer: int, attn_out: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention's output [T, Hq, Dh] -> o proj, the MoE block and both residual adds:
        (the next layer's normed input, or the final-normed hidden states; the residual)."""
        cfg, w, eps = self.config, self.layers[layer], self.config.rms_norm_eps
        a = w.attention
        out = F.linear(attn_out.reshape(attn_out.shape[0], cfg.q_size), a.o_proj, a.o_bias)
        x, residual = self.ops.add_rms_norm(out, residual, w.post_attention_norm, eps)
        out = self._moe_block(layer, x)
        last = layer + 1 == cfg.num_layers
        norm = self.weights.norm if last else self.layers[layer + 1].input_norm
        return self.ops.add_rms_norm(out, residual, norm, eps)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, D] (rows of forward's output) -> fp32 logits [N, V]."""
        return F.linear(hidden, self.weights.lm_head).float()

    @torch.inference_mode()
    def router_logits(self, moe_layer: int, x: torch.Tensor) -> torch.Tensor:
        """MoE layer `moe_layer`'s router (+ its skew bias) applied to x [T, D] -> fp32 [T, E].

        The engine may call this with MoE layer m's input to predict MoE layer m+1's experts."""
        return router_logits(self.layers[self._moe_layers[moe_layer]], x)

    def select_experts(self, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 router logits [T, E] -> (topk_ids [T, K] int64, topk_weights [T, K] fp32)."""
        return select_experts(self.config, router_logits)

    def _moe_block(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """x [T, D], already post-attention-normed -> the MoE block's (or, in a dense layer,
        the MLP's) output [T, D]."""
        return mlp_block(
            self.config, self.layers[layer], x, self._moe_index.get(layer), self.experts, self.ops
        )


def _fuse_qkv(w: LayerWeights) -> LayerWeights:
    """q, k and v projections stacked into one matrix (and their biases into one vector);
    the separate fields become views of it, so no weight is held twice."""
    a = w.attention
    qkv = torch.cat((a.q_proj, a.k_proj, a.v_proj))
    q, k, v = qkv.split([len(a.q_proj), len(a.k_proj), len(a.v_proj)])
    biases = {}
    if a.q_bias is not None:
        bias = torch.cat((a.q_bias, a.k_bias, a.v_bias))
        qb, kb, vb = bias.split([len(a.q_bias), len(a.k_bias), len(a.v_bias)])
        biases = dict(qkv_bias=bias, q_bias=qb, k_bias=kb, v_bias=vb)
    fused = dataclasses.replace(a, qkv_proj=qkv, q_proj=q, k_proj=k, v_proj=v, **biases)
    return dataclasses.replace(w, attention=fused)
