"""The gated delta rule (Gated DeltaNet's token mixer) over one sequence, two ways.

With state S [Hv, Dk, Dv] (fp32), each token t of one value head does

    S   <- exp(g_t) · S                        decay (g_t <= 0, log space)
    u_t  = beta_t · (v_t - S^T k_t)            the delta: what S mispredicts for k_t
    S   <- S + k_t u_t^T                       write the correction
    o_t  = S^T (scale · q_t)

`recurrent` runs this token by token (decode's form). `chunked` computes the same in chunks
of C tokens (prefill's form). Within a chunk starting from S0, with cumulative log decay
G_i = g_1 + ... + g_i, unrolling the recurrence gives

    u_j = beta_j v_j - beta_j e^{G_j} k_j^T S0 - sum_{i<j} beta_j e^{G_j - G_i} (k_j·k_i) u_i

i.e. (I + A) U = beta·V - beta·e^G·K S0 with A strictly lower triangular, so U is two
unit-triangular solves; then o_j = e^{G_j} q_j^T S0 + sum_{i<=j} e^{G_j - G_i} (q_j·k_i) u_i
and the chunk's final state is e^{G_C} S0 + sum_i e^{G_C - G_i} k_i u_i^T.

Both take and return the state, so a sequence may be split anywhere (prefill chunks, then
decode) and carried through: the result equals the whole sequence's to rounding.

Inputs are per token, heads of q/k possibly fewer than of v (key head h serves value heads
h·G .. h·G + G - 1, G = Hv / Hk, as transformers' repeat_interleave). q and k come in already
L2-normalised (the layer's job); the rule computes in fp32 and returns o in v's dtype.

Shape key: T = tokens, Hk/Hv = key/value heads, Dk/Dv = head dims, C = chunk, N = chunks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def recurrent(
    q: torch.Tensor,  # [T, Hk, Dk]
    k: torch.Tensor,  # [T, Hk, Dk]
    v: torch.Tensor,  # [T, Hv, Dv]
    g: torch.Tensor,  # [T, Hv] log decay, <= 0
    beta: torch.Tensor,  # [T, Hv] write strength in (0, 1)
    state: torch.Tensor | None = None,  # [Hv, Dk, Dv] fp32; None = zeros
    scale: float | None = None,  # None = Dk ** -0.5
) -> tuple[torch.Tensor, torch.Tensor]:
    """(o [T, Hv, Dv], final state [Hv, Dk, Dv] fp32), one token at a time."""
    q, k, v, g, beta, state, scale = _prepare(q, k, v, g, beta, state, scale)
    out = torch.empty_like(v)  # [T, Hv, Dv] fp32
    for t in range(v.shape[0]):
        state = state * g[t].exp()[:, None, None]
        predicted = torch.einsum("hk,hkv->hv", k[t], state)  # [Hv, Dv]
        delta = beta[t][:, None] * (v[t] - predicted)
        state = state + k[t][:, :, None] * delta[:, None, :]
        out[t] = torch.einsum("hk,hkv->hv", q[t] * scale, state)
    return out, state


def chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor | None = None,
    scale: float | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same arguments and result as `recurrent`, C tokens of matmuls at a time."""
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    out_dtype = v.dtype
    q, k, v, g, beta, state, scale = _prepare(q, k, v, g, beta, state, scale)
    num_tokens = v.shape[0]
    # Padding tokens have g = 0 and beta = 0: u = 0, no decay, so they leave S untouched.
    pad = -num_tokens % chunk_size
    q, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))
    g, beta = (F.pad(x, (0, 0, 0, pad)) for x in (g, beta))

    def heads_first(x: torch.Tensor) -> torch.Tensor:  # [T, Hv, ...] -> [Hv, N, C, ...]
        x = x.movedim(0, 1)
        return x.reshape(x.shape[0], -1, chunk_size, *x.shape[2:])

    q, k, v, g, beta = (heads_first(x) for x in (q * scale, k, v, g, beta))
    cum = g.cumsum(-1)  # [Hv, N, C] G_i
    lower = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=v.device).tril()
    # decay[..., j, i] = e^{G_j - G_i} for i <= j, 0 above the diagonal (masked before exp)
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(~lower, float("-inf")).exp()
    kk = k @ k.transpose(-1, -2)  # [Hv, N, C, C]
    a = (beta[..., None] * kk * decay).tril(-1)
    eye = torch.eye(chunk_size, dtype=v.dtype, device=v.device)
    solve = lambda rhs: torch.linalg.solve_triangular(eye + a, rhs, upper=False)  # noqa: E731
    u_from_v = solve(beta[..., None] * v)  # [Hv, N, C, Dv]
    u_from_state = solve((beta * cum.exp())[..., None] * k)  # [Hv, N, C, Dk], times S0
    qk = (q @ k.transpose(-1, -2)) * decay  # [Hv, N, C, C] causal, decayed
    out = torch.empty_like(v)
    for n in range(v.shape[1]):
        u = u_from_v[:, n] - u_from_state[:, n] @ state  # [Hv, C, Dv]
        out[:, n] = (q[:, n] * cum[:, n, :, None].exp()) @ state + qk[:, n] @ u
        to_end = (cum[:, n, -1:] - cum[:, n]).exp()  # [Hv, C] e^{G_C - G_i}
        state = (
            state * cum[:, n, -1].exp()[:, None, None]
            + (k[:, n] * to_end[..., None]).transpose(-1, -2) @ u
        )
    out = out.reshape(out.shape[0], -1, out.shape[-1])[:, :num_tokens].movedim(0, 1)
    return out.to(out_dtype), state


def _prepare(q, k, v, g, beta, state, scale):
    """fp32 copies with key heads repeated to value heads; checks the shapes."""
    num_tokens, num_value_heads, value_dim = v.shape
    num_key_heads, key_dim = k.shape[1:]
    if q.shape != k.shape or k.shape[0] != num_tokens or num_value_heads % num_key_heads:
        raise ValueError(
            f"q {tuple(q.shape)} and k {tuple(k.shape)} must be [T, Hk, Dk] with Hv "
            f"({num_value_heads}) a multiple of Hk, v {tuple(v.shape)} [T, Hv, Dv]"
        )
    if g.shape != (num_tokens, num_value_heads) or beta.shape != g.shape:
        raise ValueError(f"g and beta must be [T, Hv] = {(num_tokens, num_value_heads)}")
    state_shape = (num_value_heads, key_dim, value_dim)
    if state is None:
        state = torch.zeros(state_shape, dtype=torch.float32, device=v.device)
    elif state.shape != state_shape or state.dtype != torch.float32:
        raise ValueError(
            f"state must be fp32 {state_shape}, got {state.dtype} {tuple(state.shape)}"
        )
    group = num_value_heads // num_key_heads
    q, k = (x.float().repeat_interleave(group, dim=1) for x in (q, k))  # [T, Hv, Dk]
    scale = key_dim**-0.5 if scale is None else scale
    return q, k, v.float(), g.float(), beta.float(), state, scale
