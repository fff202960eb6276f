"""Paged fused MoE == contiguous twin == torch reference, under Triton's interpreter.

Shape key: T = tokens, D = hidden, I = expert intermediate, E = experts, K = top-k.
Every case scatters the expert pages through a NaN-filled pool (spare pages stay NaN),
puts some matrices in loading-buffer slots, points the table rows of unrouted experts at
NaN pages, and NaN-poisons the outputs: a wrong page, an unrouted expert read, or an
unwritten row shows up as NaN or as a mismatch.
"""

import random
from dataclasses import dataclass

import pytest
import torch

from rimuru.kernels import (
    GemmTile,
    MoeConfig,
    fused_moe_contiguous,
    fused_moe_paged,
    fused_moe_paged_reference,
    fused_moe_reference,
)

SMALL = MoeConfig(16, GemmTile(32, 32), GemmTile(32, 32))
# Many pairs: the interpreter's cost follows the number of programs, so use fewer, larger ones.
LARGE = MoeConfig(64, GemmTile(64, 64), GemmTile(64, 32))
# Weights (and the down GEMM's intermediate) through device-made TMA descriptors.
SMALL_TMA = MoeConfig(16, GemmTile(32, 32, tma=True), GemmTile(32, 32, tma=True))
LARGE_TMA = MoeConfig(64, GemmTile(64, 64, tma=True), GemmTile(64, 32, tma=True))
# Tail tiles: a last block of up to 16 (32) pairs computes 16 (32) rows; the down GEMM on
# its own setting reads the up GEMM's unwritten rows through TMA.
LARGE_TAIL = MoeConfig(64, GemmTile(64, 64, tail=2), GemmTile(64, 32, tail=1))
LARGE_TAIL_TMA = MoeConfig(64, GemmTile(64, 64, tma=True, tail=2), GemmTile(64, 32, tma=True))
# The down GEMM's TMA descriptor is SUB_M rows tall under a tail (the H200 table uses it).
DOWN_TAIL_TMA = MoeConfig(64, GemmTile(64, 64, tail=2), GemmTile(64, 32, tma=True, tail=2))
HUGE_TAIL = MoeConfig(256, GemmTile(16, 16, tail=2), GemmTile(32, 16, tail=1))
# Persistent programs (3 under the interpreter) walking many tiles each, with and without
# tails and TMA.
PERSISTENT = MoeConfig(
    64, GemmTile(64, 64, tail=2, schedule="persistent"), GemmTile(64, 32, schedule="flattened")
)
FLATTENED_TMA = MoeConfig(
    64,
    GemmTile(64, 64, tma=True, schedule="flattened"),
    GemmTile(64, 32, tma=True, schedule="persistent"),
)
# x's rows copied into sorted order before the up GEMM (A then a plain block, through TMA),
# with pointer loads and tails too.
PRESORT_TMA = MoeConfig(64, GemmTile(64, 64, tma=True, presort=True), GemmTile(64, 32, tma=True))
# The H200 table's Mixtral entries: presorted rows through TMA with tail tiles.
PRESORT_TMA_TAIL = MoeConfig(
    64, GemmTile(64, 64, tma=True, tail=2, presort=True), GemmTile(64, 32, tma=True, tail=2)
)
PRESORT_TAIL = MoeConfig(
    64, GemmTile(64, 64, tail=2, presort=True, schedule="persistent"), GemmTile(64, 32, tail=1)
)
TOLERANCE = {torch.float32: 1e-5, torch.float16: 5e-3}


@dataclass(frozen=True)
class Case:
    dtype: torch.dtype
    num_tokens: int
    top_k: int
    num_experts: int
    hidden: int
    inter: int
    config: MoeConfig = SMALL


def _cases() -> list[Case]:
    """Fixed corners plus a seeded sample of token counts 1..300 and top-k 1..8."""
    cases = [
        Case(torch.float32, 1, 1, 1, 32, 16),  # one token, one expert
        Case(torch.float16, 300, 8, 16, 48, 40, LARGE),  # many pairs: multi-program align path
        Case(torch.float32, 37, 2, 6, 40, 24),  # D, I not multiples of the tiles
        Case(torch.float16, 9, 3, 5, 33, 17, MoeConfig(32, GemmTile(16, 16), GemmTile(64, 32))),
        Case(torch.float16, 300, 8, 16, 48, 40, LARGE_TMA),
        Case(torch.float32, 37, 2, 6, 40, 24, SMALL_TMA),  # K not a multiple of BK: zero fill
        Case(torch.float16, 9, 3, 5, 33, 17, SMALL_TMA),  # rows of 66 bytes: pointer fallback
        Case(torch.float16, 300, 8, 16, 48, 40, LARGE_TAIL),
        Case(torch.float32, 150, 5, 12, 32, 24, LARGE_TAIL_TMA),  # ~75 pairs per routed expert
        Case(torch.float32, 150, 5, 12, 32, 24, DOWN_TAIL_TMA),
        Case(torch.float16, 37, 2, 6, 40, 24, LARGE_TAIL),  # every block a tail
        # block_m 256: one block per expert (64- or 128-row tiles), or a full block and a tail
        Case(torch.float16, 70, 4, 5, 32, 24, HUGE_TAIL),
        Case(torch.float32, 300, 2, 2, 40, 24, HUGE_TAIL),
        Case(torch.float16, 300, 8, 16, 48, 40, PERSISTENT),
        Case(torch.float32, 150, 5, 12, 32, 24, FLATTENED_TMA),
        Case(torch.float32, 37, 2, 6, 40, 24, FLATTENED_TMA),  # K not a multiple of BK
        Case(torch.float16, 300, 8, 16, 48, 40, PRESORT_TMA),
        Case(torch.float32, 37, 2, 6, 40, 24, PRESORT_TMA),
        Case(torch.float16, 9, 3, 5, 33, 17, PRESORT_TMA),  # rows of 66 bytes: pointer fallback
        Case(torch.float32, 150, 5, 12, 32, 24, PRESORT_TAIL),
        Case(torch.float32, 150, 5, 12, 32, 24, PRESORT_TMA_TAIL),
    ]
    rng = random.Random(4)
    for dtype in (torch.float32, torch.float16):
        for _ in range(3):
            top_k = rng.randint(1, 8)
            num_tokens = rng.randint(1, 300)
            config = LARGE if num_tokens * top_k > 512 else SMALL
            cases.append(Case(dtype, num_tokens, top_k, rng.randint(top_k, 12), 32, 24, config))
    return cases


def _paged_layout(w1, w3, w2, routed: set[int], seed: int):
    """Pages of every routed expert's (w1, w3, w2) at random pool pages or buffer slots."""
    E, inter, hidden = w1.shape
    gen = torch.Generator().manual_seed(seed)
    matrices = [(e, j, m) for e in range(E) for j, m in enumerate((w1[e], w3[e], w2[e]))]
    in_buffer = torch.rand(len(matrices), generator=gen) < 0.3
    num_pages = len(matrices) + 5
    page_order = torch.randperm(num_pages, generator=gen).tolist()
    pool = torch.full((num_pages, inter * hidden), float("nan"), dtype=w1.dtype)
    buffer = torch.full((len(matrices), inter * hidden), float("nan"), dtype=w1.dtype)
    table = torch.empty(E, 3, dtype=torch.int32)
    nan_page = page_order[-1]  # never written: what unrouted experts point at
    for i, (e, j, matrix) in enumerate(matrices):
        if e not in routed:
            table[e, j] = nan_page
        elif in_buffer[i]:
            buffer[i] = matrix.reshape(-1)
            table[e, j] = -i - 1
        else:
            pool[page_order[i]] = matrix.reshape(-1)
            table[e, j] = page_order[i]
    return pool, buffer, table


@pytest.mark.parametrize(
    "case",
    _cases(),
    ids=lambda c: (
        f"{str(c.dtype)[6:]}-T{c.num_tokens}-K{c.top_k}-E{c.num_experts}-D{c.hidden}-I{c.inter}"
        + ("-tma" if c.config.gemm1.tma else "")
        + ("-tail" if c.config.gemm1.tail else "")
        + (f"-{c.config.gemm1.schedule}" if c.config.gemm1.schedule != "grid" else "")
        + ("-presort" if c.config.gemm1.presort else "")
    ),
)
def test_paged_equals_contiguous_equals_reference(case: Case):
    gen = torch.Generator().manual_seed(case.num_tokens * 31 + case.top_k)
    T, K, E, D, inter = case.num_tokens, case.top_k, case.num_experts, case.hidden, case.inter
    x = torch.randn(T, D, generator=gen).to(case.dtype)
    w1 = (torch.randn(E, inter, D, generator=gen) / D**0.5).to(case.dtype)
    w3 = (torch.randn(E, inter, D, generator=gen) / D**0.5).to(case.dtype)
    w2 = (torch.randn(E, D, inter, generator=gen) / inter**0.5).to(case.dtype)
    # Route over a subset of experts when there is room, so some rows stay unrouted.
    candidates = max(K, E - 2)
    topk_ids = torch.rand(T, candidates, generator=gen).topk(K, dim=1).indices
    topk_weights = torch.rand(T, K, generator=gen)
    pool, buffer, table = _paged_layout(w1, w3, w2, set(topk_ids.unique().tolist()), seed=T)

    paged = torch.full_like(x, float("nan"))
    fused_moe_paged(x, topk_ids, topk_weights, pool, buffer, table, config=case.config, out=paged)
    contig = torch.full_like(x, float("nan"))
    w13 = torch.cat([w1, w3], dim=1)
    fused_moe_contiguous(x, topk_ids, topk_weights, w13, w2, config=case.config, out=contig)
    ref = fused_moe_reference(x.float(), topk_ids, topk_weights, w1, w3, w2)

    assert paged.isfinite().all() and contig.isfinite().all()
    assert torch.equal(paged, contig)
    err = (paged.float() - ref).norm() / ref.norm()
    assert err < TOLERANCE[case.dtype], f"relative error {err:.2e}"
    paged_ref = fused_moe_paged_reference(
        x.float(), topk_ids, topk_weights, pool.float(), buffer.float(), table
    )
    assert torch.allclose(paged_ref, ref, rtol=1e-5, atol=1e-6)


def test_int32_routing_and_default_config():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 32, generator=gen)
    w13 = torch.randn(4, 32, 32, generator=gen) / 6
    w2 = torch.randn(4, 32, 16, generator=gen) / 4
    ids = torch.tensor([[0, 3], [3, 1], [2, 0]], dtype=torch.int32)
    weights = torch.rand(3, 2, generator=gen, dtype=torch.float64)
    got = fused_moe_contiguous(x, ids, weights, w13, w2)  # config from the default table
    ref = fused_moe_reference(x, ids, weights, w13[:, :16], w13[:, 16:], w2)
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_zero_tokens_return_empty():
    x = torch.empty(0, 32)
    out = fused_moe_contiguous(
        x,
        torch.empty(0, 2, dtype=torch.int64),
        torch.empty(0, 2),
        torch.zeros(4, 32, 32),
        torch.zeros(4, 32, 16),
    )
    assert out.shape == (0, 32)


def _args():
    x = torch.randn(4, 32)
    ids = torch.zeros(4, 2, dtype=torch.int64)
    ids[:, 1] = 1
    pool = torch.randn(6, 16 * 32)
    table = torch.arange(6, dtype=torch.int32).view(2, 3)
    return dict(
        x=x,
        topk_ids=ids,
        topk_weights=torch.rand(4, 2),
        pool_pages=pool,
        buffer_pages=None,
        expert_table=table,
    )


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"x": torch.randn(4, 32).half()}, "pool_pages must be a 2-D torch.float16"),
        ({"x": torch.randn(4, 32).t()}, "x must be"),
        ({"topk_ids": torch.zeros(3, 2, dtype=torch.int64)}, "topk_ids must be"),
        ({"topk_weights": torch.rand(4, 3)}, "topk_weights must be"),
        ({"expert_table": torch.zeros(2, 3, dtype=torch.int64)}, "expert_table must be int32"),
        ({"pool_pages": torch.randn(6, 16 * 32 + 1)}, "not I\\*D"),
        ({"buffer_pages": torch.randn(2, 8 * 32)}, "buffer_pages pages hold"),
        (
            {"topk_ids": torch.zeros(4, 3, dtype=torch.int64), "topk_weights": torch.rand(4, 3)},
            "top-k must lie",
        ),
    ],
)
def test_bad_paged_input_is_refused(change, match):
    args = _args() | change
    with pytest.raises(ValueError, match=match):
        fused_moe_paged(**args)


def test_bad_contiguous_weights_are_refused():
    x, ids, w = torch.randn(2, 32), torch.zeros(2, 1, dtype=torch.int64), torch.rand(2, 1)
    with pytest.raises(ValueError, match="w13"):
        fused_moe_contiguous(x, ids, w, torch.zeros(4, 32, 32), torch.zeros(4, 32, 8))
    with pytest.raises(ValueError, match="contiguous"):
        fused_moe_contiguous(
            x, ids, w, torch.zeros(4, 32, 32).transpose(1, 2), torch.zeros(4, 32, 16)
        )


def test_tma_needs_16_byte_aligned_bases_and_strides():
    """The launcher takes the TMA path only where every descriptor is legal."""
    from rimuru.kernels.moe_gemm import WeightSource, _tma_ok

    stack = torch.zeros(4, 2 * 40, 48, dtype=torch.float16)  # w13 [E, 2I, D], rows of 96 bytes
    source = WeightSource(stack, stack, False, 0, stack.stride(0))
    x = torch.zeros(8, 48, dtype=torch.float16)
    assert _tma_ok(x, source, n=40, k=48, up=True, gather=True)
    # Sorted x rows (presort) go through a descriptor too: their base must be aligned.
    assert not _tma_ok(x.view(-1)[1:].view(-1)[: 7 * 48].view(7, 48), source, n=40, k=48,
                       up=True, gather=False)  # fmt: skip
    assert _tma_ok(x, source, n=40, k=48, up=True, gather=False)
    odd = torch.zeros(4, 2 * 17, 33, dtype=torch.float16)  # rows of 66 bytes
    assert not _tma_ok(
        x[:, :33], WeightSource(odd, odd, False, 0, odd.stride(0)), n=17, k=33, up=True,
        gather=True,
    )  # fmt: skip
    shifted = stack.view(-1)[1:].view(-1)  # base 2 bytes past an aligned address
    pages = WeightSource(
        shifted[: 3 * 40 * 48].view(3, -1), stack.view(-1, 40 * 48), True, 40 * 48, 0
    )
    assert not _tma_ok(x, pages, n=40, k=48, up=True, gather=True)
