"""Gated DeltaNet's short causal convolution (depthwise, kernel K, then SiLU), with its state.

Token t of channel c sees itself and the K - 1 tokens before it:

    out[t, c] = silu( sum_k weight[c, k] · x[t - (K - 1) + k, c] )

Tokens before the sequence's start are the state: the last K - 1 inputs of the previous
chunk (zeros before the first). The function returns the state for the next chunk, so a
sequence split anywhere (prefill chunks, then one token per decode step) convolves exactly
as when whole. The state keeps x's dtype: it is the inputs themselves, not a reduction.

Shape key: T = tokens, C = channels (conv_dim: q, k and v side by side), K = kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv1d(
    x: torch.Tensor,  # [T, C]
    weight: torch.Tensor,  # [C, K]
    state: torch.Tensor | None = None,  # [C, K - 1]; None = zeros (a sequence's start)
) -> tuple[torch.Tensor, torch.Tensor]:
    """(silu(conv(x)) [T, C], next state [C, K - 1])."""
    channels, kernel = weight.shape
    if x.dim() != 2 or x.shape[1] != channels:
        raise ValueError(f"x must be [T, C={channels}], got {tuple(x.shape)}")
    if state is None:
        state = x.new_zeros(channels, kernel - 1)
    elif state.shape != (channels, kernel - 1):
        raise ValueError(
            f"state must be [C, K - 1] = {(channels, kernel - 1)}, got {tuple(state.shape)}"
        )
    padded = torch.cat((state.to(x.dtype), x.t()), dim=1)  # [C, K - 1 + T]
    out = F.conv1d(padded[None], weight[:, None, :], groups=channels)[0]  # [C, T]
    return F.silu(out).t(), padded[:, padded.shape[1] - (kernel - 1) :].clone()
