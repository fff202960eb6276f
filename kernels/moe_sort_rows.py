"""x's rows in the alignment's sorted order, so the up GEMM can read A as a plain block.

Shape key: T = tokens, D = hidden, K = top-k, R = rows of the alignment (max_blocks * BM).

    sort_rows(x [T, D], align, top_k) -> xs [R, D]      xs[r] = x[sorted_pair_ids[r] // K]

Rows below num_padded get x's row of their pair, or zeros for padding (as the gathering up
GEMM reads them: its padding rows come out 0); rows past num_padded are left unwritten and
are never read. Why a separate pass: the up GEMM otherwise gathers x rows with pointer
loads, which Hopper's tensor-memory accelerator cannot do (no TMA gather on sm_90); the copy
costs num_padded * D * 2 bytes written.
"""

import torch
import triton
import triton.language as tl

from rimuru.kernels.moe_align import MoeAlignment

_BLOCK_R = 16  # divides every block_m (>= 16), so a program's rows are all below num_padded or none


@triton.jit(do_not_specialize=["num_pairs", "top_k"])
def _sort_rows_kernel(
    x_ptr, out_ptr, sorted_ptr, num_padded_ptr, num_pairs, top_k, D, stride_x, stride_out,
    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    first = tl.program_id(0) * BLOCK_R
    if first >= tl.load(num_padded_ptr):  # past the used blocks: sorted ids unwritten there
        return
    rows = first + tl.arange(0, BLOCK_R)
    pair = tl.load(sorted_ptr + rows)
    valid = pair < num_pairs
    token = (pair // top_k).to(tl.int64)
    for d in range(0, D, BLOCK_D):
        cols = d + tl.arange(0, BLOCK_D)
        in_row = (cols < D)[None, :]
        v = tl.load(
            x_ptr + token[:, None] * stride_x + cols[None, :],
            mask=valid[:, None] & in_row,
            other=0.0,
        )
        tl.store(out_ptr + rows.to(tl.int64)[:, None] * stride_out + cols[None, :], v, mask=in_row)


def sort_rows(x: torch.Tensor, align: MoeAlignment, top_k: int) -> torch.Tensor:
    """xs [R, D]: x's row of each pair, in the alignment's row order. Callers check x."""
    num_rows = align.max_blocks * align.block_m
    out = torch.empty(num_rows, x.shape[1], dtype=x.dtype, device=x.device)
    block_d = min(triton.next_power_of_2(x.shape[1]), 512)
    _sort_rows_kernel[(triton.cdiv(num_rows, _BLOCK_R),)](
        x, out, align.sorted_pair_ids, align.num_padded, align.num_pairs, top_k, x.shape[1],
        x.stride(0), out.stride(0), BLOCK_R=_BLOCK_R, BLOCK_D=block_d, num_warps=4,
    )  # fmt: skip
    return out


def sort_rows_reference(x: torch.Tensor, align: MoeAlignment, top_k: int) -> torch.Tensor:
    """sort_rows's first num_padded rows: x[p // K] for a pair p, zeros for padding."""
    used = align.sorted_pair_ids[: int(align.num_padded)].long()
    valid = used < align.num_pairs
    out = torch.zeros(used.numel(), x.shape[1], dtype=x.dtype)
    out[valid] = x[used[valid] // top_k]
    return out
