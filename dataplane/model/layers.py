"""The stateless pieces of the decoder, with Hugging Face's numerics.

Shape key: T = tokens, H = heads, Dh = head dim, D = hidden, S = MLP size.
Norms compute in fp32 and cast back before the weight multiply, and RoPE angles are computed
in fp32, exactly as transformers does, so fp32 logits match it to rounding (bf16 ones differ
by a few bf16 ulps: transformers rounds some routing weights to bf16, rimuru keeps them fp32).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim: [..., N] with weight [N]."""
    x_fp32 = x.float()
    x_fp32 = x_fp32 * torch.rsqrt(x_fp32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x_fp32.to(x.dtype)


def rope_inv_freq(head_dim: int, theta: float, device: torch.device) -> torch.Tensor:
    """[Dh/2] fp32 inverse frequencies of standard (unscaled) RoPE."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    return (1.0 / (theta**exponents)).to(device)


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: [T, Dh] for positions [T], both halves repeated (rotate_half convention)."""
    freqs = positions.float()[:, None] * inv_freq[None, :]  # [T, Dh/2]
    angles = torch.cat((freqs, freqs), dim=-1)  # [T, Dh]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, H, Dh] by the angles of its token: x·cos + rotate_half(x)·sin."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def swiglu_mlp(
    x: torch.Tensor, gate_proj: torch.Tensor, up_proj: torch.Tensor, down_proj: torch.Tensor
) -> torch.Tensor:
    """down(silu(gate(x)) * up(x)): x [T, D], gate/up [S, D], down [D, S] -> [T, D]."""
    return F.linear(F.silu(F.linear(x, gate_proj)) * F.linear(x, up_proj), down_proj)


def router_topk(
    logits: torch.Tensor, bias: torch.Tensor | None, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, E] (+ fp32 bias [E]) -> (topk_ids [T, K] int64, topk_weights [T, K]
    fp32): softmax in fp32, the k most probable, optionally renormalized over them."""
    scores = logits.float()
    if bias is not None:
        scores = scores + bias
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32)  # [T, E]
    weights, ids = torch.topk(probs, top_k, dim=-1)  # [T, K]
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return ids, weights
