"""Fused MoE over expert pages of the shared pool, its contiguous twin, and the torch references.

Shape key: T = tokens, D = hidden, I = expert intermediate, E = experts, K = top-k, P = T*K.

Launchers (one call = block-align + up GEMM with SiLU(gate)*up + down GEMM + top-k sum, no
host synchronisation, so they can be captured in a CUDA graph; ``config`` defaults to the
tuned table's entry):

    fused_moe_paged(x [T, D], topk_ids [T, K] int, topk_weights [T, K] float,
                    pool_pages [num_pages, I*D], buffer_pages [num_slots, I*D] | None,
                    expert_table [E, 3] int32, *, config=None, out=None) -> [T, D]
    fused_moe_contiguous(x, topk_ids, topk_weights, w13 [E, 2I, D], w2 [E, D, I],
                         *, config=None, out=None, num_experts=None) -> [T, D]
    fused_moe_variant(T, K, E, I, D, dtype, device) -> a key: calls with equal keys launch the
                         same compiled kernels (the engine's start-up warm-up uses it)

expert_table[e] holds the page ids of (w1, w3, w2) of expert e, Hugging Face layouts
(w1, w3: [I, D]; w2: [D, I]); id >= 0 is a pool page, id < 0 is loading-buffer slot -id - 1.
Rows of experts that no token routes to are never read. pool_pages and buffer_pages share
x's dtype; a page may be longer than I*D (its row stride is the page size).

References (fp32 math, result in x.dtype, read only routed experts; the CPU path):

    fused_moe_reference(x, topk_ids, topk_weights, w1 [E, I, D], w3 [E, I, D], w2 [E, D, I])
    fused_moe_paged_reference(x, topk_ids, topk_weights, pool_pages, buffer_pages, expert_table)
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F

from rimuru.kernels.moe_align import align_variant, moe_align_block_size
from rimuru.kernels.moe_configs import MoeConfig, get_moe_config
from rimuru.kernels.moe_gemm import WeightSource, launch_down_gemm, launch_up_gemm
from rimuru.kernels.moe_sum import moe_sum

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _check_routing(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, E: int):
    if x.dim() != 2 or x.dtype not in FLOAT_DTYPES or x.stride(1) != 1:
        raise ValueError(
            f"x must be [T, D] fp16/bf16/fp32 with unit column stride; got {tuple(x.shape)} "
            f"{x.dtype} strides {x.stride()}"
        )
    T = x.shape[0]
    if (
        topk_ids.dim() != 2
        or topk_ids.shape[0] != T
        or topk_ids.dtype
        not in (
            torch.int32,
            torch.int64,
        )
    ):
        raise ValueError(
            f"topk_ids must be int32/int64 [T={T}, K]; got {tuple(topk_ids.shape)} {topk_ids.dtype}"
        )
    if topk_weights.shape != topk_ids.shape or not topk_weights.is_floating_point():
        raise ValueError(
            f"topk_weights must be a float tensor shaped like topk_ids {tuple(topk_ids.shape)}; "
            f"got {tuple(topk_weights.shape)} {topk_weights.dtype}"
        )
    if not 1 <= topk_ids.shape[1] <= E:
        raise ValueError(f"top-k must lie in [1, E={E}]; got {topk_ids.shape[1]}")
    for name, t in (("topk_ids", topk_ids), ("topk_weights", topk_weights)):
        if t.device != x.device:
            raise ValueError(
                f"{name} is on {t.device} but x is on {x.device}; move it to x's device"
            )


def _check_out(out: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    if out is None:
        return torch.empty_like(x, memory_format=torch.contiguous_format)
    if out.shape != x.shape or out.dtype != x.dtype or not out.is_contiguous():
        raise ValueError(
            f"out must be a contiguous {x.dtype} tensor {tuple(x.shape)}; got {tuple(out.shape)} "
            f"{out.dtype} contiguous={out.is_contiguous()}"
        )
    return out


def _check_pages(name: str, pages: torch.Tensor, x: torch.Tensor, width: int | None) -> None:
    if pages.dim() != 2 or pages.dtype != x.dtype or pages.device != x.device:
        raise ValueError(
            f"{name} must be a 2-D {x.dtype} view on {x.device} [num_pages, I*D]; got "
            f"{tuple(pages.shape)} {pages.dtype} on {pages.device}"
        )
    if pages.stride(1) != 1 or pages.stride(0) < pages.shape[1]:
        raise ValueError(f"{name} rows must be unit-stride pages; got strides {pages.stride()}")
    if width is not None and pages.shape[1] != width:
        raise ValueError(f"{name} pages hold {pages.shape[1]} elements; pool pages hold {width}")


def _run(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    up_source: WeightSource,
    down_source: WeightSource,
    expert_table: torch.Tensor | None,
    num_experts: int,
    inter_size: int,
    config: MoeConfig | None,
    out: torch.Tensor,
) -> torch.Tensor:
    T, D = x.shape
    top_k = topk_ids.shape[1]
    if T == 0:
        return out
    if config is None:
        config = get_moe_config(num_experts, inter_size, D, T, top_k, x.dtype, x.device)
    align = moe_align_block_size(topk_ids, num_experts, config.block_m, expert_table)
    weights = topk_weights.to(torch.float32).contiguous().view(-1)  # [P]
    # [R, I] in the alignment's sorted row order (moe_gemm.py), padding rows included.
    act = torch.empty(align.max_blocks * align.block_m, inter_size, dtype=x.dtype, device=x.device)
    launch_up_gemm(
        x, act, up_source, align, weights, config.gemm1, inter_size=inter_size, top_k=top_k
    )
    # With top-1 each token has one pair, so gemm2 writes the output rows directly.
    y = out if top_k == 1 else torch.empty(T * top_k, D, dtype=x.dtype, device=x.device)
    launch_down_gemm(
        act, y, down_source, align, weights, config.gemm2, inter_size=inter_size, top_k=top_k
    )
    if top_k > 1:
        moe_sum(y, out, top_k)
    return out


def fused_moe_paged(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    pool_pages: torch.Tensor,
    buffer_pages: torch.Tensor | None,
    expert_table: torch.Tensor,
    *,
    config: MoeConfig | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """MoE MLP of the tokens ``x`` reading each expert's matrices where they lie (module doc)."""
    if expert_table.dim() != 2 or expert_table.shape[1] != 3 or expert_table.dtype != torch.int32:
        raise ValueError(
            f"expert_table must be int32 [E, 3] (w1, w3, w2 page ids); got "
            f"{tuple(expert_table.shape)} {expert_table.dtype}"
        )
    E = expert_table.shape[0]
    _check_routing(x, topk_ids, topk_weights, E)
    _check_pages("pool_pages", pool_pages, x, None)
    D = x.shape[1]
    if pool_pages.shape[1] % D:
        raise ValueError(f"a page of {pool_pages.shape[1]} elements is not I*D for D={D}")
    if buffer_pages is None or buffer_pages.shape[0] == 0:
        buffer_pages = pool_pages  # never addressed: no table entry is negative
    _check_pages("buffer_pages", buffer_pages, x, pool_pages.shape[1])
    if expert_table.device != x.device:
        raise ValueError(f"expert_table is on {expert_table.device}; move it to {x.device}")
    table = expert_table.contiguous()
    # Pages are addressed as base + id * row stride, so both views must step alike.
    if buffer_pages.stride(0) != pool_pages.stride(0):
        raise ValueError(
            f"buffer_pages row stride {buffer_pages.stride(0)} differs from pool_pages "
            f"{pool_pages.stride(0)}; use the same page size"
        )
    source = WeightSource(pool_pages, buffer_pages, True, pool_pages.stride(0), 0)
    inter_size = pool_pages.shape[1] // D
    out = _check_out(out, x)
    return _run(x, topk_ids, topk_weights, source, source, table, E, inter_size, config, out)


def fused_moe_contiguous(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    *,
    config: MoeConfig | None = None,
    out: torch.Tensor | None = None,
    num_experts: int | None = None,
) -> torch.Tensor:
    """The same MoE over stacked weights w13 = [w1; w3] [E, 2I, D] and w2 [E, D, I].

    ``num_experts`` (>= E) picks the config and alignment as for a layer of that many
    experts: a caller that stacks only the E' experts a step routes to (the gather path)
    passes the layer's E, so its kernels do not change with E'."""
    if w13.dim() != 3 or w2.dim() != 3:
        raise ValueError(f"w13 must be [E, 2I, D] and w2 [E, D, I]; got {w13.shape}, {w2.shape}")
    E, two_i, D = w13.shape
    _check_routing(x, topk_ids, topk_weights, E)
    inter_size = two_i // 2
    if (
        two_i % 2
        or x.shape[1] != D
        or tuple(w2.shape) != (E, D, inter_size)
        or w13.dtype != x.dtype
        or w2.dtype != x.dtype
    ):
        raise ValueError(
            f"for x {tuple(x.shape)} {x.dtype} expected w13 [E, 2I, {x.shape[1]}] and w2 "
            f"[E, {x.shape[1]}, I] of that dtype; got {tuple(w13.shape)} {w13.dtype}, "
            f"{tuple(w2.shape)} {w2.dtype}"
        )
    if not (w13.is_contiguous() and w2.is_contiguous()):
        raise ValueError("w13 and w2 must be contiguous; call .contiguous() once at load time")
    if w13.device != x.device or w2.device != x.device:
        raise ValueError(f"w13 and w2 must be on x's device {x.device}")
    if num_experts is not None and num_experts < E:
        raise ValueError(f"num_experts={num_experts} is fewer than the {E} stacked experts")
    up = WeightSource(w13, w13, False, 0, w13.stride(0))
    down = WeightSource(w2, w2, False, 0, w2.stride(0))
    out = _check_out(out, x)
    E = num_experts or E
    return _run(x, topk_ids, topk_weights, up, down, None, E, inter_size, config, out)


def fused_moe_variant(
    num_tokens: int,
    top_k: int,
    num_experts: int,
    inter_size: int,
    hidden_size: int,
    dtype: torch.dtype,
    device: torch.device,
) -> tuple:
    """Equal keys = the same compiled kernels: the tile config (tuned bucket or default)
    and the align step's variant. Shapes, dtype and weight layout are fixed per engine."""
    config = get_moe_config(num_experts, inter_size, hidden_size, num_tokens, top_k, dtype, device)
    return (config, align_variant(num_tokens * top_k, num_experts, config.block_m))


ExpertMatrices = Callable[[int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def _reference(x, topk_ids, topk_weights, matrices: ExpertMatrices) -> torch.Tensor:
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)  # [T, D]
    xf = x.float()
    for expert in topk_ids.unique().tolist():
        tokens, slots = (topk_ids == expert).nonzero(as_tuple=True)
        w1, w3, w2 = (m.float() for m in matrices(expert))
        h = xf[tokens]  # [n, D]
        act = F.silu(h @ w1.T) * (h @ w3.T)  # [n, I]
        routed = (act @ w2.T) * topk_weights[tokens, slots, None].float()
        out.index_add_(0, tokens, routed)
    return out.to(x.dtype)


def fused_moe_reference(x, topk_ids, topk_weights, w1, w3, w2) -> torch.Tensor:
    return _reference(x, topk_ids, topk_weights, lambda e: (w1[e], w3[e], w2[e]))


def fused_moe_paged_reference(
    x, topk_ids, topk_weights, pool_pages, buffer_pages, expert_table
) -> torch.Tensor:
    D = x.shape[1]
    inter_size = pool_pages.shape[1] // D

    def page(page_id: int) -> torch.Tensor:
        return pool_pages[page_id] if page_id >= 0 else buffer_pages[-page_id - 1]

    def matrices(expert: int):
        w1_id, w3_id, w2_id = expert_table[expert].tolist()
        return (
            page(w1_id).view(inter_size, D),
            page(w3_id).view(inter_size, D),
            page(w2_id).view(D, inter_size),
        )

    return _reference(x, topk_ids, topk_weights, matrices)
