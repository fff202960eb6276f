"""Router top-k of a MoE layer in one launch: fp32 cast, skew bias, softmax, top-k, renorm;
optionally the router's GEMM too.

Shape key: T = tokens, D = hidden, E = experts, K = top-k.

    router_topk(logits [T, E] any float, bias [E] fp32 | None, top_k, renormalize)
        -> (topk_ids [T, K] int64, topk_weights [T, K] fp32)
    route(x [T, D], weight [E, D], bias, top_k, renormalize) -> the same, of x @ weight.T

`route` computes the logits in the program that picks from them (fp32 accumulation, rounded
to x's dtype as torch's GEMM output is), in place of a separate GEMM launch: the router's
weight is small (0.5 MB at Qwen3's shapes), yet its library GEMM took 5.4 µs a decode layer
on the H200. Its logits may differ from torch's GEMM in the last bit (summation order), like
any two GEMMs. Not yet timed on a GPU, so not yet the engine's (model/ops.py).

The same as the torch chain it replaces (rimuru.dataplane.model.layers.router_topk, the CPU
path: .float(), + bias, softmax, torch.topk, divide by the top-k sum), which is six to seven
launches a layer on the GPU. The k largest are taken from the logits, not from their
softmax: the same experts, in the same descending order, except where two distinct logits
round to one fp32 probability (then torch's choice is unspecified too). Equal logits go to
the lower expert id. Weights are exp(l - max) over the sum of all E (or, renormalized, of
the K chosen) exponentials.

Each program takes BLOCK_T rows whole ([BLOCK_T, next_pow2(E)] in registers) and picks the
k largest by K rounds of max-and-mask; every row gets K distinct, in-range ids (the GEMMs
index pages by them). NaN logits count as -inf, unlike torch's (which would pick them, with
NaN weights): a row with some is routed over the others, a row of -inf or NaN only to the
lowest ids.
"""

import torch
import triton
import triton.language as tl

from rimuru.kernels.kv_pages import dot_precision


@triton.jit(do_not_specialize=["num_tokens"])  # one compiled variant serves every batch
def _router_topk_kernel(
    in_ptr, w_ptr, bias_ptr, ids_ptr, weights_ptr, num_tokens, num_experts, hidden, stride_t,
    stride_w, HAS_BIAS: tl.constexpr, TOP_K: tl.constexpr, TOP_K_P2: tl.constexpr,
    RENORMALIZE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
    GEMM: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """in_ptr: the logits [T, E], or with GEMM the hidden states [T, D] (w_ptr: [E, D])."""
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_E)
    row_ok = rows < num_tokens
    col_ok = cols < num_experts
    if GEMM:
        acc = tl.zeros((BLOCK_T, BLOCK_E), dtype=tl.float32)
        for d0 in range(0, hidden, BLOCK_D):
            d = d0 + tl.arange(0, BLOCK_D)
            d_ok = d < hidden
            a = tl.load(
                in_ptr + rows.to(tl.int64)[:, None] * stride_t + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :],
                other=0.0,
            )  # [BLOCK_T, BLOCK_D]
            w = tl.load(
                w_ptr + cols[:, None] * stride_w + d[None, :],
                mask=col_ok[:, None] & d_ok[None, :],
                other=0.0,
            )  # [BLOCK_E, BLOCK_D]
            acc = tl.dot(a, tl.trans(w), acc, input_precision=DOT_PRECISION)
        x = acc.to(in_ptr.dtype.element_ty).to(tl.float32)  # rounded as torch's GEMM output
    else:
        x = tl.load(
            in_ptr + rows.to(tl.int64)[:, None] * stride_t + cols[None, :],
            mask=row_ok[:, None] & col_ok[None, :],
            other=0.0,
        ).to(tl.float32)
    if HAS_BIAS:
        x += tl.load(bias_ptr + cols, mask=col_ok, other=0.0)[None, :]
    x = tl.where(col_ok[None, :] & (x == x), x, float("-inf"))  # padding and NaN: -inf
    top = tl.max(x, axis=1)  # [BLOCK_T]
    total = tl.sum(tl.exp(x - top[:, None]), axis=1)
    slots = tl.arange(0, TOP_K_P2)
    ids = tl.zeros((BLOCK_T, TOP_K_P2), dtype=tl.int64)
    picked = tl.zeros((BLOCK_T, TOP_K_P2), dtype=tl.float32)
    # Columns not yet picked. Picked ones leave by this mask, not by a value: a row whose
    # remaining logits are all -inf still finds a free column equal to its max (-inf).
    free = (rows[:, None] >= 0) & col_ok[None, :]  # [BLOCK_T, BLOCK_E]
    for k in tl.static_range(TOP_K):
        best = tl.max(tl.where(free, x, float("-inf")), axis=1)
        hit = free & (x == best[:, None])
        expert = tl.min(tl.where(hit, cols[None, :], BLOCK_E), axis=1)
        ids = tl.where(slots[None, :] == k, expert.to(tl.int64)[:, None], ids)
        picked = tl.where(slots[None, :] == k, tl.exp(best - top)[:, None], picked)
        free = free & (cols[None, :] != expert[:, None])
    if RENORMALIZE:
        total = tl.sum(picked, axis=1)  # unpicked slots hold 0
    out = rows.to(tl.int64)[:, None] * TOP_K + slots[None, :]
    mask = row_ok[:, None] & (slots[None, :] < TOP_K)
    tl.store(ids_ptr + out, ids, mask=mask)
    tl.store(weights_ptr + out, picked / total[:, None], mask=mask)


def router_topk(
    logits: torch.Tensor, bias: torch.Tensor | None, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (topk_ids [T, K] int64, topk_weights [T, K] fp32) of router logits [T, E]."""
    if logits.dim() != 2 or not logits.is_floating_point() or logits.stride(1) != 1:
        raise ValueError(
            f"logits must be a float [T, E] tensor with unit column stride; got "
            f"{tuple(logits.shape)} {logits.dtype} strides {logits.stride()}"
        )
    num_experts = logits.shape[1]
    block_t = max(1, min(16, 4096 // triton.next_power_of_2(num_experts)))  # <= 4096 fp32 values
    return _launch(logits, None, bias, top_k, renormalize, num_experts, block_t)


def route(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    top_k: int,
    renormalize: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (topk_ids [T, K] int64, topk_weights [T, K] fp32) of the logits x @ weight.T."""
    if x.dim() != 2 or not x.is_floating_point() or x.stride(1) != 1:
        raise ValueError(
            f"x must be a float [T, D] tensor with unit column stride; got {tuple(x.shape)} "
            f"{x.dtype} strides {x.stride()}"
        )
    if (
        weight.dim() != 2
        or weight.shape[1] != x.shape[1]
        or weight.dtype != x.dtype
        or weight.stride(1) != 1
        or weight.device != x.device
    ):
        raise ValueError(
            f"weight must be [E, {x.shape[1]}] {x.dtype} on {x.device} with unit column stride; "
            f"got {tuple(weight.shape)} {weight.dtype} strides {weight.stride()} on {weight.device}"
        )
    if triton.next_power_of_2(weight.shape[0]) > 512:
        raise ValueError(
            f"route takes at most 512 experts (a [16, E] fp32 tile a program); "
            f"got {weight.shape[0]}: use router_topk on the GEMM's output"
        )
    # tl.dot needs 16 rows: [16, next_pow2(E)] fp32 a program, 8,192 values at E = 512
    return _launch(x, weight, bias, top_k, renormalize, weight.shape[0], 16)


def _block_d(block_e: int) -> int:
    """Hidden columns a GEMM step takes: the router tile [BLOCK_E, BLOCK_D] stays at 16 KB in
    bf16 (each pipeline stage holds one), down to tl.dot's 16 at E = 512."""
    return max(16, min(64, 8192 // block_e))


def _launch(inputs, weight, bias, top_k, renormalize, num_experts, block_t):
    num_tokens = inputs.shape[0]
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k must lie in [1, E={num_experts}]; got {top_k}")
    if bias is not None and (
        bias.shape != (num_experts,) or bias.dtype != torch.float32 or bias.device != inputs.device
    ):
        raise ValueError(
            f"bias must be fp32 [{num_experts}] on {inputs.device}; got {tuple(bias.shape)} "
            f"{bias.dtype} on {bias.device}"
        )
    ids = torch.empty(num_tokens, top_k, dtype=torch.int64, device=inputs.device)
    weights = torch.empty(num_tokens, top_k, dtype=torch.float32, device=inputs.device)
    if num_tokens == 0:
        return ids, weights
    gemm = weight is not None
    block_e = triton.next_power_of_2(num_experts)
    if gemm:
        block_e = max(16, block_e)  # tl.dot's smallest N
    _router_topk_kernel[(triton.cdiv(num_tokens, block_t),)](
        inputs, weight if gemm else inputs, inputs if bias is None else bias, ids, weights,
        num_tokens, num_experts, inputs.shape[1], inputs.stride(0),
        weight.stride(0) if gemm else 0, HAS_BIAS=bias is not None, TOP_K=top_k,
        TOP_K_P2=triton.next_power_of_2(top_k), RENORMALIZE=renormalize, BLOCK_T=block_t,
        BLOCK_E=block_e, GEMM=gemm, BLOCK_D=_block_d(block_e),
        DOT_PRECISION=dot_precision(inputs.dtype), num_warps=4,
    )  # fmt: skip
    return ids, weights
