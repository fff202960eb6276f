"""Router top-k of a MoE layer in one launch: fp32 cast, skew bias, softmax, top-k, renorm.

Shape key: T = tokens, E = experts, K = top-k.

    router_topk(logits [T, E] any float, bias [E] fp32 | None, top_k, renormalize)
        -> (topk_ids [T, K] int64, topk_weights [T, K] fp32)

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


@triton.jit(do_not_specialize=["num_tokens"])  # one compiled variant serves every batch
def _router_topk_kernel(
    logits_ptr, bias_ptr, ids_ptr, weights_ptr, num_tokens, num_experts, stride_t,
    HAS_BIAS: tl.constexpr, TOP_K: tl.constexpr, TOP_K_P2: tl.constexpr,
    RENORMALIZE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_E)
    row_ok = rows < num_tokens
    col_ok = cols < num_experts
    x = tl.load(
        logits_ptr + rows.to(tl.int64)[:, None] * stride_t + cols[None, :],
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
    num_tokens, num_experts = logits.shape
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k must lie in [1, E={num_experts}]; got {top_k}")
    if bias is not None and (
        bias.shape != (num_experts,) or bias.dtype != torch.float32 or bias.device != logits.device
    ):
        raise ValueError(
            f"bias must be fp32 [{num_experts}] on {logits.device}; got {tuple(bias.shape)} "
            f"{bias.dtype} on {bias.device}"
        )
    ids = torch.empty(num_tokens, top_k, dtype=torch.int64, device=logits.device)
    weights = torch.empty(num_tokens, top_k, dtype=torch.float32, device=logits.device)
    if num_tokens == 0:
        return ids, weights
    block_e = triton.next_power_of_2(num_experts)
    block_t = max(1, min(16, 4096 // block_e))  # <= 4096 fp32 values a program
    _router_topk_kernel[(triton.cdiv(num_tokens, block_t),)](
        logits, logits if bias is None else bias, ids, weights, num_tokens, num_experts,
        logits.stride(0), HAS_BIAS=bias is not None, TOP_K=top_k,
        TOP_K_P2=triton.next_power_of_2(top_k), RENORMALIZE=renormalize, BLOCK_T=block_t,
        BLOCK_E=block_e, num_warps=4,
    )  # fmt: skip
    return ids, weights
