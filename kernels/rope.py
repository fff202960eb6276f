"""Rotary position embedding of q and k in one launch, optionally after a per-head RMSNorm
(Qwen3's q_norm / k_norm).

Shape key: T = tokens, Hq / Hkv = query / KV heads, Dh = head size (even), h = Dh / 2.

    qk_norm_rope(q [T, Hq, Dh], k [T, Hkv, Dh], cos [T, Dh], sin [T, Dh],
                 q_weight [Dh] | None, k_weight [Dh] | None, eps) -> (q', k')

Rotate-half convention (Llama, Qwen, Mixtral): cos and sin repeat their first half, and

    x' = x * cos + rotate_half(x) * sin,   rotate_half(x) = [-x[h:], x[:h]]

Each product and the sum are rounded to the dtype, as torch computes `x * cos + r * sin` in
bf16, so the kernel gives the torch path's values. One program per token: its q heads, then
its k heads, each as a [heads, Dh/2] pair of halves.

Why a kernel: in torch, the two norms and two rotations are ~26 launches per layer.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(
    src, dst, w_ptr, c1, c2, s1, s2, num_heads, eps,
    HEAD_DIM: tl.constexpr, HAS_NORM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """One token's heads [num_heads, Dh] as two halves [BLOCK_H, BLOCK]: norm, rotate, store."""
    half = HEAD_DIM // 2
    heads = tl.arange(0, BLOCK_H)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    mask = (heads < num_heads) & (cols < half)
    offs = heads * HEAD_DIM + cols
    dtype = dst.dtype.element_ty
    f1 = tl.load(src + offs, mask=mask, other=0.0).to(tl.float32)
    f2 = tl.load(src + half + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_NORM:  # per head, rounded as rms_norm.py rounds
        sum_sq = tl.sum(f1 * f1, axis=1) + tl.sum(f2 * f2, axis=1)  # [BLOCK_H]
        inv_rms = (1.0 / tl.sqrt(sum_sq / HEAD_DIM + eps))[:, None]
        w1 = tl.load(w_ptr + cols, mask=cols < half, other=0.0).to(tl.float32)
        w2 = tl.load(w_ptr + half + cols, mask=cols < half, other=0.0).to(tl.float32)
        f1 = ((f1 * inv_rms).to(dtype).to(tl.float32) * w1).to(dtype).to(tl.float32)
        f2 = ((f2 * inv_rms).to(dtype).to(tl.float32) * w2).to(dtype).to(tl.float32)
    o1 = (f1 * c1).to(dtype).to(tl.float32) + (-f2 * s1).to(dtype).to(tl.float32)
    o2 = (f2 * c2).to(dtype).to(tl.float32) + (f1 * s2).to(dtype).to(tl.float32)
    tl.store(dst + offs, o1.to(dtype), mask=mask)
    tl.store(dst + half + offs, o2.to(dtype), mask=mask)


@triton.jit
def _qk_norm_rope_kernel(
    q_ptr,
    k_ptr,
    q_out_ptr,
    k_out_ptr,
    cos_ptr,
    sin_ptr,
    q_weight_ptr,
    k_weight_ptr,
    num_q_heads,
    num_kv_heads,
    stride_qt,  # input rows (may be wider than Hq * Dh, e.g. views of a fused qkv)
    stride_kt,
    stride_cos,
    eps,
    HEAD_DIM: tl.constexpr,
    HAS_NORM: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HKV: tl.constexpr,
    BLOCK: tl.constexpr,  # >= HEAD_DIM / 2
):
    t = tl.program_id(0).to(tl.int64)
    half = HEAD_DIM // 2
    cols = tl.arange(0, BLOCK)[None, :]
    mask = cols < half
    angles = t * stride_cos + cols
    c1 = tl.load(cos_ptr + angles, mask=mask, other=0.0).to(tl.float32)
    c2 = tl.load(cos_ptr + half + angles, mask=mask, other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + angles, mask=mask, other=0.0).to(tl.float32)
    s2 = tl.load(sin_ptr + half + angles, mask=mask, other=0.0).to(tl.float32)
    _rotate_heads(q_ptr + t * stride_qt, q_out_ptr + t * num_q_heads * HEAD_DIM, q_weight_ptr,
                  c1, c2, s1, s2, num_q_heads, eps, HEAD_DIM, HAS_NORM, BLOCK_HQ, BLOCK)  # fmt: skip
    _rotate_heads(k_ptr + t * stride_kt, k_out_ptr + t * num_kv_heads * HEAD_DIM, k_weight_ptr,
                  c1, c2, s1, s2, num_kv_heads, eps, HEAD_DIM, HAS_NORM, BLOCK_HKV, BLOCK)  # fmt: skip


def _check(q, k, cos, sin, q_weight, k_weight) -> None:
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(
            f"q and k must be [T, H, Dh] with the same T and Dh, got "
            f"{tuple(q.shape)} and {tuple(k.shape)}"
        )
    num_tokens, _, head_dim = q.shape
    if head_dim % 2:
        raise ValueError(f"head size must be even for RoPE, got {head_dim}")
    if cos.shape != (num_tokens, head_dim) or sin.shape != cos.shape:
        raise ValueError(f"cos and sin must be [{num_tokens}, {head_dim}], got {tuple(cos.shape)}")
    if (q_weight is None) != (k_weight is None):
        raise ValueError("give both q_weight and k_weight (a QK norm) or neither")
    if q_weight is not None and (q_weight.shape != (head_dim,) or k_weight.shape != (head_dim,)):
        raise ValueError(f"q_weight and k_weight must be [{head_dim}]")
    for name, t in (("q", q), ("k", k)):
        if t.stride(2) != 1 or t.stride(1) != head_dim:
            raise ValueError(f"{name}[t] must be a contiguous [H, Dh]; got strides {t.stride()}")
    if cos.stride(1) != 1 or sin.stride() != cos.stride():
        raise ValueError("cos and sin must be row-major with the same strides")
    others = [k, cos, sin] + ([q_weight, k_weight] if q_weight is not None else [])
    if any(t.dtype != q.dtype or t.device != q.device for t in others):
        raise ValueError(
            f"k, cos, sin and the norm weights must be {q.dtype} on {q.device} like q (the "
            "kernel rounds every step to q's dtype)"
        )


def qk_norm_rope(q, k, cos, sin, q_weight=None, k_weight=None, eps: float = 1e-6):
    _check(q, k, cos, sin, q_weight, k_weight)
    num_tokens, num_q_heads, head_dim = q.shape
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # contiguous
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    has_norm = q_weight is not None
    if num_tokens:
        _qk_norm_rope_kernel[(num_tokens,)](
            q, k, q_out, k_out, cos, sin,
            q_weight if has_norm else q, k_weight if has_norm else k,
            num_q_heads, k.shape[1], q.stride(0), k.stride(0), cos.stride(0), eps,
            HEAD_DIM=head_dim, HAS_NORM=has_norm, BLOCK_HQ=triton.next_power_of_2(num_q_heads),
            BLOCK_HKV=triton.next_power_of_2(k.shape[1]),
            BLOCK=triton.next_power_of_2(head_dim // 2), num_warps=4,
        )  # fmt: skip
    return q_out, k_out


def qk_norm_rope_reference(q, k, cos, sin, q_weight=None, k_weight=None, eps: float = 1e-6):
    """The same function in torch, as the model's CPU path computes it."""

    def norm(x, w):
        xf = x.float()
        return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)

    def rotate(x):
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos[:, None, :] + rotated * sin[:, None, :]

    if q_weight is not None:
        q, k = norm(q, q_weight), norm(k, k_weight)
    return rotate(q), rotate(k)
