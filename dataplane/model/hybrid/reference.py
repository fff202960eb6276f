"""A hybrid decoder (Qwen3-Next, Qwen3.5-MoE) over one whole sequence: the torch reference.

    h ── norm ── mixer ──(+)── norm ── MoE (routed top-k + sigmoid-gated shared expert) ──(+)── h
                   │                   or a dense MLP (Qwen3-Next's mlp_only_layers)
                   ├─ linear_attention: Gated DeltaNet
                   │    qkv ─ causal conv1d + SiLU ─ q, k (L2-normalised), v
                   │    beta = sigmoid(b), g = -exp(A_log) · softplus(a + dt_bias)
                   │    gated delta rule ─ RMSNorm(o) · silu(z) ─ out_proj
                   └─ full_attention: causal GQA attention, q/k norms, partial RoPE,
                        output · sigmoid(gate) ─ o_proj

Every RMSNorm but the GDN's gated one scales by (1 + w): the checkpoints store zero-centred
weights. No paging, no pool, no KV cache: each call recomputes the sequence, which is what a
test oracle needs; the GDN layers return their final recurrent and conv states, the ones a
later chunk (or decode step) would start from.

Shape key: T = tokens, D = hidden, Hq/Hkv = attention heads, Dh = head dim, R = rotary dims,
Hk/Hv = GDN key/value heads, Dk/Dv = their dims, Cc = conv channels, V = vocab.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from rimuru.dataplane.model.config import ModelConfig
from rimuru.dataplane.model.hybrid import gated_delta
from rimuru.dataplane.model.hybrid.causal_conv import causal_conv1d
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
from rimuru.dataplane.model.layers import rope_cos_sin, rope_inv_freq
from rimuru.dataplane.model.moe_block import mlp_block
from rimuru.dataplane.model.ops import TorchOps
from rimuru.dataplane.model.reference import DenseExperts
from rimuru.dataplane.model.weights import GlobalWeights, WeightSource


class HybridReference:
    def __init__(
        self,
        config: ModelConfig,
        global_weights: GlobalWeights,
        layers: Sequence[HybridLayerWeights],
        experts: DenseExperts,
    ) -> None:
        if not config.is_hybrid or len(layers) != config.num_layers:
            raise ValueError(f"need a hybrid config and its {config.num_layers} layers' weights")
        self.config = config
        self._global = global_weights
        self._layers = list(layers)
        self._experts = experts  # indexed by MoE layer
        self._inv_freq = rope_inv_freq(config.rotary_dim, config.rope_theta, torch.device("cpu"))

    @classmethod
    def from_source(
        cls, source: WeightSource, dtype: torch.dtype = torch.float32
    ) -> HybridReference:
        cfg, cpu = source.config, torch.device("cpu")
        experts = DenseExperts([source.expert_weights(m, dtype) for m in range(cfg.num_moe_layers)])
        layers = [source.layer_weights(i, cpu, dtype) for i in range(cfg.num_layers)]
        return cls(cfg, source.global_weights(cpu, dtype), layers, experts)

    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[T] token ids of one sequence from position 0 -> fp32 logits [T, V]."""
        h = self.hidden_states(input_ids)
        return F.linear(self._norm(h, self._global.norm), self._global.lm_head).float()

    def hidden_states(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[T] token ids of one sequence from position 0 -> the residual stream after the
        last layer [T, D], before the final norm."""
        h = self._global.embed_tokens[input_ids]  # [T, D]
        positions = torch.arange(len(input_ids))
        rope = rope_cos_sin(positions, self._inv_freq, h.dtype)  # [T, R] each
        for layer, w in enumerate(self._layers):
            x = self._norm(h, w.input_norm)
            if isinstance(w.mixer, GatedDeltaNetWeights):
                mixed, _, _ = self.gated_delta_net(w.mixer, x)
            else:
                mixed = self.gated_attention(w.mixer, x, rope)
            h = h + mixed
            h = h + self._mlp(layer, w, self._norm(h, w.post_attention_norm))
        return h

    def gated_delta_net(
        self,
        w: GatedDeltaNetWeights,
        x: torch.Tensor,  # [T, D]
        ssm_state: torch.Tensor | None = None,  # [Hv, Dk, Dv] fp32
        conv_state: torch.Tensor | None = None,  # [Cc, K - 1]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(out [T, D], final ssm_state, final conv_state), continuing from the given ones."""
        mixed, conv_state = causal_conv1d(F.linear(x, w.qkv_proj), w.conv_weight, conv_state)
        q, k, v = gdn_split(self.config, mixed)
        beta, g = gdn_gates(w, x)
        out, ssm_state = gated_delta.chunked(q, k, v, g, beta, ssm_state)  # [T, Hv, Dv]
        return gdn_output(self.config, w, x, out), ssm_state, conv_state

    def gated_attention(
        self, w: GatedAttentionWeights, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        q, k, v, gate = gated_attention_inputs(self.config, w, x, rope, self._norm)
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, enable_gqa=True
        ).transpose(0, 1)  # [T, Hq, Dh]
        return gated_attention_output(w, out, gate)

    def _mlp(self, layer: int, w: HybridLayerWeights, x: torch.Tensor) -> torch.Tensor:
        moe_layer = self.config.moe_layers.index(layer) if w.dense_mlp is None else None
        return mlp_block(self.config, w, x, moe_layer, self._experts, TorchOps())

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """Zero-centred RMSNorm: scale by (1 + w), in fp32, then cast (transformers' order)."""
        x_fp32 = x.float()
        x_fp32 = x_fp32 * torch.rsqrt(
            x_fp32.pow(2).mean(-1, keepdim=True) + self.config.rms_norm_eps
        )
        return (x_fp32 * (1.0 + weight.float())).to(x.dtype)
