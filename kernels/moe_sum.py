"""Top-k sum of the fused MoE: each token's output is the sum of its K routed experts' rows.

Shape key: T = tokens, K = top-k, D = hidden.

    moe_sum(y [T*K, D], out [T, D], top_k) -> out      out[t] = sum_k y[t*K + k]

Rows are added in fp32 in the order k = 0..K-1 and rounded once (torch.sum also accumulates
a bf16 sum in fp32). Why a kernel: it beat torch.sum over the middle dim of [T, K, D] at
every shape timed. Each program adds one token's
K rows over a block of columns, in registers.
"""

import torch
import triton
import triton.language as tl


# T varies with the batch: one compiled variant serves every batch (dataplane/engine/startup/warmup.py).
@triton.jit(do_not_specialize=["num_tokens"])
def _moe_sum_kernel(y_ptr, out_ptr, num_tokens, D, TOP_K: tl.constexpr, BLOCK_D: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = cols < D
    # One row at a time into a 1-D fp32 accumulator: each thread adds its own columns, so
    # nothing crosses threads (summing a [K, BLOCK_D] block over K instead was slower than
    # torch.sum at K = 8).
    acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        acc += tl.load(y_ptr + (token * TOP_K + k) * D + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + token * D + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


def moe_sum(y: torch.Tensor, out: torch.Tensor, top_k: int) -> torch.Tensor:
    """out [T, D] = y [T*K, D] summed over each token's K rows. Callers check tensors (both
    contiguous, one dtype, y.shape[0] == T * top_k)."""
    num_tokens, hidden = out.shape
    block_d = min(triton.next_power_of_2(hidden), 1024)
    grid = (num_tokens, triton.cdiv(hidden, block_d))
    _moe_sum_kernel[grid](
        y, out, num_tokens, hidden, TOP_K=top_k, BLOCK_D=block_d, num_warps=4
    )  # fmt: skip
    return out


def moe_sum_reference(y: torch.Tensor, top_k: int) -> torch.Tensor:
    return torch.sum(y.view(-1, top_k, y.shape[1]), dim=1)
