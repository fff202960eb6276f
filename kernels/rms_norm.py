"""RMSNorm, optionally fused with the residual add before it (vLLM's fused_add_rms_norm).

Shape key: R = rows, N = normalised size.

    rms_norm(x [..., N], weight [N], eps) -> y [..., N]
    rms_norm(x [..., N], weight [N], eps, residual=r [..., N]) -> (y, x + r)

The numerics are Hugging Face's, step for step, so the kernel and the torch path round alike:
the sum x + r is rounded to x's dtype first (it is the new residual stream); the norm runs in
fp32 on that rounded sum; its result is rounded to the dtype *before* the weight multiply,
whose product is rounded again. One program per row; the row must fit one block.

Why a kernel: in torch this is 8-9 launches (add, float, pow, mean, add, rsqrt, mul, to, mul)
per norm, four norms per Qwen3 layer, ~1,700 of a decode step's ~3,400 launches.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    residual_out_ptr,
    n_cols,
    stride_x,
    stride_residual,
    stride_out,
    stride_residual_out,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_residual + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(residual_out_ptr + row * stride_residual_out + cols, x, mask=mask)
    xf = x.to(tl.float32)
    inv_rms = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / n_cols + eps)
    y = (xf * inv_rms).to(out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (y * w).to(out_ptr.dtype.element_ty), mask=mask)


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    return t.reshape(-1, n) if t.stride(-1) == 1 else t.contiguous().reshape(-1, n)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
):
    n = x.shape[-1]
    if weight.shape != (n,):
        raise ValueError(f"weight must be [{n}] (x's last dim), got {tuple(weight.shape)}")
    if residual is not None and (
        residual.shape != x.shape or residual.dtype != x.dtype or residual.device != x.device
    ):
        raise ValueError(
            f"residual must match x: {tuple(x.shape)} {x.dtype} on {x.device}, "
            f"got {tuple(residual.shape)} {residual.dtype} on {residual.device}"
        )
    if weight.dtype != x.dtype or weight.device != x.device or weight.stride(0) != 1:
        raise ValueError(
            f"weight must be a contiguous {x.dtype} vector on {x.device}, "
            f"got {weight.dtype} on {weight.device} with stride {weight.stride()}"
        )
    rows = _rows(x, n)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out_rows = out.view(-1, n)
    res_rows = _rows(residual, n) if residual is not None else rows
    new_residual = torch.empty_like(out) if residual is not None else out
    new_rows = new_residual.view(-1, n)
    if rows.shape[0]:
        _rms_norm_kernel[(rows.shape[0],)](
            rows, res_rows, weight, out_rows, new_rows, n,
            rows.stride(0), res_rows.stride(0), out_rows.stride(0), new_rows.stride(0), eps,
            HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(n),
            num_warps=4 if n <= 4096 else 8,
        )  # fmt: skip
    return out if residual is None else (out, new_residual)


def rms_norm_reference(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
):
    """The same function in torch, as the model's CPU path computes it."""
    if residual is not None:
        x = x + residual
    xf = x.float()
    y = weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return y if residual is None else (y, x)
