"""The pieces of a hybrid layer that are the same whole-sequence and paged: the Gated
DeltaNet's projections around its two stateful steps, and gated attention's projections
around attention itself. `HybridReference` (the oracle) and `HybridTransformer` (the
engine's model) both build their layers from these, so they differ only where the states
and the KV cache live.

    GDN:   x ─ qkv_proj ─> [conv + SiLU: stateful] ─ split ─ q, k (L2-normalised), v
           x ─ b_proj, a_proj ─> beta = sigmoid(b), g = -exp(A_log)·softplus(a + dt_bias)
           [gated delta rule: stateful] ─ o ─ RMSNorm(o)·silu(z) ─ out_proj
    attn:  x ─ q_proj, gate_proj, k_proj, v_proj ─ q/k norms ─ partial RoPE ─> [attention]
           ─ o·sigmoid(gate) ─ o_proj

Shape key: T = tokens, D = hidden, Hk/Hv = GDN key/value heads, Dk/Dv = their dims,
Cc = conv channels, Hq/Hkv = attention heads, Dh = head dim, R = rotary dims.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from rimuru.dataplane.model.config import ModelConfig
from rimuru.dataplane.model.hybrid.weights import GatedAttentionWeights, GatedDeltaNetWeights
from rimuru.dataplane.model.layers import apply_rope, rms_norm

_L2_EPS = 1e-6  # inside the rsqrt, as fla and transformers normalise q and k

Norm = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x, weight) -> normed x


def gdn_gates(w: GatedDeltaNetWeights, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, D] -> (beta [T, Hv], g [T, Hv]), both fp32: the rule's write strength and log
    decay. fp32 because in half precision exp(A_log) may overflow to inf."""
    beta = torch.sigmoid(F.linear(x, w.b_proj)).float()  # in x's dtype first, as transformers
    g = -w.a_log.float().exp() * F.softplus(F.linear(x, w.a_proj).float() + w.dt_bias.float())
    return beta, g


def gdn_split(
    cfg: ModelConfig, mixed: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The conv's output [T, Cc] -> q, k [T, Hk, Dk] (fp32, L2-normalised), v [T, Hv, Dv]."""
    gdn, num_tokens = cfg.linear_attention, mixed.shape[0]
    q, k, v = mixed.split([gdn.key_size, gdn.key_size, gdn.value_size], dim=-1)
    q, k = (l2_normalise(t.reshape(num_tokens, gdn.num_key_heads, -1)) for t in (q, k))
    return q, k, v.reshape(num_tokens, gdn.num_value_heads, -1)


def gdn_output(
    cfg: ModelConfig, w: GatedDeltaNetWeights, x: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """The rule's output [T, Hv, Dv] -> gated RMSNorm (plain scale) · silu(z) -> [T, D]."""
    num_tokens = x.shape[0]
    z = F.linear(x, w.z_proj).view_as(out)
    out = (rms_norm(out, w.norm, cfg.rms_norm_eps) * F.silu(z.float())).to(x.dtype)
    return F.linear(out.reshape(num_tokens, -1), w.out_proj)


def gated_attention_inputs(
    cfg: ModelConfig,
    w: GatedAttentionWeights,
    x: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor],
    norm: Norm,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, D] -> q [T, Hq, Dh], k, v [T, Hkv, Dh] (q/k normed and rotated), gate [T, Hq*Dh]."""
    num_tokens = x.shape[0]
    q = norm(F.linear(x, w.q_proj).view(num_tokens, cfg.num_heads, -1), w.q_norm)
    k = norm(F.linear(x, w.k_proj).view(num_tokens, cfg.num_kv_heads, -1), w.k_norm)
    v = F.linear(x, w.v_proj).view(num_tokens, cfg.num_kv_heads, -1)
    q, k = (partial_rope(t, *rope, cfg.rotary_dim) for t in (q, k))
    return q, k, v, F.linear(x, w.gate_proj)


def gated_attention_output(
    w: GatedAttentionWeights, out: torch.Tensor, gate: torch.Tensor
) -> torch.Tensor:
    """Attention's output [T, Hq, Dh] -> o · sigmoid(gate) -> o_proj -> [T, D]."""
    return F.linear(out.reshape(out.shape[0], -1) * torch.sigmoid(gate), w.o_proj)


def l2_normalise(x: torch.Tensor) -> torch.Tensor:
    x = x.float()  # the rule computes in fp32; normalise there too, as transformers does
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + _L2_EPS)


def partial_rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int
) -> torch.Tensor:
    """RoPE on the first R dims of each head [T, H, Dh]; the rest pass through."""
    if rotary_dim == x.shape[-1]:
        return apply_rope(x, cos, sin)
    return torch.cat((apply_rope(x[..., :rotary_dim], cos, sin), x[..., rotary_dim:]), dim=-1)
